"""Optional compiled CPU kernels for the notebook's scan and Fourier read (SPEC §3, §8.1), with its backward,
for the read trust, and for a whole decoded byte of the model.

`ScanReadChunk` in scan_read_chunk.py runs a chunk as a few dozen PyTorch ops per block of positions; each op
streams a [block, F] complex tensor through the cache, and the loop in time (a cumulative sum) runs at
scalar speed. Here the same chunk is two loops in C++, one pass over the keys per position:

    forward   S += c_t · CV[x_t] ⊙ K_{t-1};  H_t[k_f] += (S ⊙ conj(K_t))_f  (halved at DC and Nyquist)
    backward  G = A_t[k_f] ⊙ K_t (halved likewise);  suffix += G;  ∂c_t = Re⟨suffix, CV[x_t] ⊙ K_{t-1}⟩

H_t are the N bins of `FourierReadOut`, kept as their Hermitian half (N/2 + 1 bins: the read is their real inverse
FFT, `read_half_bins`), and A_t their adjoint, picked from an rfft of the read's gradient (`adjoint_half_bins`);
both FFTs stay in PyTorch, batched over the chunk. Bound keys are formed inside both loops from their window's ids.
The PyTorch blocks stay the fallback; scan_read.py's reference is the oracle the tests hold both to.
`bundled_keys` forms [KR]'s bundled keys and their norms in one pass (`NotebookTables.bind`; PyTorch's
embedding-bag sum and norm, `bundled_keys_reference`, are its oracle and fallback). `notebook_step` is a decoded
byte without autograd (keys, their scales, write, the read's bins) in one call instead of some thirty small PyTorch
ops (`scan_and_read_step`); `read_trust` is `ReadTrust.forward` and
`read_trust_backward` its vector-Jacobian product (read_trust.py keeps its PyTorch form as the oracle);
`decode_step` is a whole decoded byte, trunk, notebook, read trust and byte head (decode_step.py); `decode_greedy`
is `generate`'s greedy loop over it (greedy_generation.py).

The C++ source is kernels.cpp beside this module; `save_pretrained` copies it into a checkpoint folder, and
`fetch_source` brings it next to a remote-code copy of this module (Transformers copies only Python files).
The kernels are compiled on first use with torch's `load_inline` (a C++ compiler and ninja; about 20 s,
cached per CPU model under TORCH_EXTENSIONS_DIR) for this machine's instruction set. Where that fails, the
source is missing, or with KATHLEEN_NOTEBOOK_KERNELS=0, `fourier_kernels()` returns None and the PyTorch path
runs.
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import logging
import os
import platform
import shutil
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

from .atomic import write_atomically

logger = logging.getLogger(__name__)

SOURCE_FILE = "kernels.cpp"  # beside this module, and copied into every checkpoint folder
FUNCTIONS = ["bundled_keys", "scan_read_bins", "scan_read_bins_backward", "notebook_step", "decode_step",
             "decode_greedy", "read_trust", "read_trust_backward"]

STALE_BUILD_SECONDS = 600  # a build takes ~20 s (minutes on a loaded machine); a lock older than this is a dead one
_lock = threading.Lock()
_loaded: dict[str, ModuleType | None] = {}


def source_path() -> Path:
    return Path(__file__).with_name(SOURCE_FILE)


def is_remote_code_copy() -> bool:
    """Whether this module is a remote-code copy in Transformers' modules cache (not the installed package)."""
    return __name__.startswith("transformers_modules.")


def fetch_source(pretrained_model_name_or_path: str, **hub_kwargs) -> None:
    """Give a remote-code copy of this module the checkpoint's kernels.cpp (Transformers copies the Python files
    only). The modules cache keeps one copy per set of Python files, so a checkpoint whose kernels.cpp changed while
    its Python did not finds an earlier checkpoint's source there: it is replaced (atomically), and removed for a
    checkpoint without one, whose PyTorch ops then run. A process builds its kernels once (`fourier_kernels`), from
    the source of the first checkpoint it loads. The installed package keeps its own source."""
    if not is_remote_code_copy():
        return
    from transformers.utils import cached_file

    found = cached_file(str(pretrained_model_name_or_path), SOURCE_FILE, _raise_exceptions_for_missing_entries=False,
                        **hub_kwargs)
    target = source_path()
    if found is None:
        target.unlink(missing_ok=True)
    elif not (target.exists() and filecmp.cmp(found, target, shallow=False)):
        write_atomically(target, lambda staged: shutil.copyfile(found, staged))


def cpu_signature(source: str) -> str:
    """What the compiled code depends on besides its source: CPU model and flags (it is built with
    -march=native), Python and torch versions. Part of the build's name, so no build runs on another CPU."""
    described = [platform.machine(), platform.python_version(), torch.__version__]
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            described += sorted({line for line in cpuinfo if line.startswith(("model name", "flags"))})
    except OSError:
        described.append(platform.processor())
    return hashlib.sha256("\n".join(described + [source]).encode()).hexdigest()[:12]


def build_name(source: str) -> str:
    """The build's name in torch's cache: one per source and machine."""
    return f"kathleen_notebook_kernels_{cpu_signature(source)}"


def fourier_kernels() -> ModuleType | None:
    """The compiled kernels (`FUNCTIONS`), or None where they cannot be built or KATHLEEN_NOTEBOOK_KERNELS=0. Built
    once per process, then taken from the build cache."""
    if os.environ.get("KATHLEEN_NOTEBOOK_KERNELS", "1") == "0":
        return None
    with _lock:
        if "fourier" not in _loaded:
            _loaded["fourier"] = build()
        return _loaded["fourier"]


def notebook_path() -> str:
    """Which code runs the notebook on a CPU, in words (benchmarks report it beside their numbers)."""
    if fourier_kernels() is not None:
        return "compiled CPU kernels (kernels.cpp)"
    return "PyTorch ops (KATHLEEN_NOTEBOOK_KERNELS=0, no kernels.cpp, or the kernels did not build)"


def is_built(name: str) -> bool:
    """Whether torch's build cache holds a compiled `name` (a private torch helper: False if it moved)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return any(Path(_get_build_directory(name, verbose=False)).glob("*.so"))
    except Exception:
        return False


def build_lock(name: str) -> Path | None:
    """The `lock` file torch's build of `name` takes (a private torch helper: None if it moved)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return Path(_get_build_directory(name, verbose=False)) / "lock"
    except Exception:
        return None


def lock_holder(lock: Path) -> Path:
    """Where `build` names the process that takes `lock` ("host pid"): torch's lock file itself is empty."""
    return lock.with_name("lock.holder")


def holder_is_gone(lock: Path) -> bool:
    """Whether the process named beside `lock` has died on this host (killed while it held the lock: torch's own
    `finally` never ran). False where no process is named, another host's is, or it may still run: the lock's age
    decides then. POSIX only (signal 0 asks whether a pid exists; on Windows it is a Ctrl-C)."""
    try:
        host, pid = lock_holder(lock).read_text().split()
        pid = int(pid)
    except (OSError, ValueError):
        return False
    if os.name != "posix" or host != platform.node():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it runs, as another user
        return False
    return False


def clear_stale_build_lock(lock: Path) -> None:
    """Remove a build `lock` whose process died while it held it (killed): torch would wait on it forever. A lock
    whose process is gone goes at once, any other once it has grown stale; until then it is another process's build
    or load in progress: wait until it is released."""
    warned = False
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:  # none, or released while we waited
            return
        gone = holder_is_gone(lock)
        if gone or age > STALE_BUILD_SECONDS:
            logger.warning("removing a stale build lock of the notebook's CPU kernels (%s, %.0f s old: its "
                           "process %s)", lock, age, "is gone" if gone else "died mid-build")
            lock.unlink(missing_ok=True)
            return
        if not warned:
            logger.warning("waiting for another process's build of the notebook's CPU kernels (%s; taken as "
                           "stale after %d s)", lock, STALE_BUILD_SECONDS)
            warned = True
        time.sleep(0.5)


def build() -> ModuleType | None:
    """Compile the kernels, or load them from the build cache; None (and a warning) where that fails."""
    if not source_path().exists():
        logger.warning("the notebook's CPU kernels have no source (%s is missing); using PyTorch ops", SOURCE_FILE)
        return None
    source = source_path().read_text()
    name = build_name(source)
    if not is_built(name):  # a first use stalls for the compiler: say why
        logger.warning("building the notebook's CPU kernels, once for this machine (about 20 s; "
                       "KATHLEEN_NOTEBOOK_KERNELS=0 skips it)")
    lock = build_lock(name)
    holder = f"{platform.node()} {os.getpid()}"
    if lock is not None:
        clear_stale_build_lock(lock)
        with contextlib.suppress(OSError):  # a process that finds the lock after this one was killed need not wait
            lock.parent.mkdir(parents=True, exist_ok=True)
            lock_holder(lock).write_text(holder)
    try:
        from torch.utils.cpp_extension import load_inline

        return load_inline(name, cpp_sources=source, extra_cflags=["-O3", "-march=native", "-fopenmp-simd"],
                           functions=FUNCTIONS)
    except Exception as error:  # no compiler, no ninja, a read-only cache: the PyTorch path still runs
        logger.warning("the notebook's CPU kernels could not be built (%s); using PyTorch ops", error)
        return None
    finally:
        with contextlib.suppress(OSError):
            if lock is not None and lock_holder(lock).read_text() == holder:
                lock_holder(lock).unlink()
