"""The compiled CPU kernel of the scan and Fourier read (kernels.py) equals the PyTorch blocks it replaces, in
values and gradients (fp32, both paths); without a compiler the PyTorch path runs."""

import os
import pathlib
import platform
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from conftest import reference_config, run_fresh_python
from modeling_kathleen_notebook import KathleenConfig, kernels
from modeling_kathleen_notebook.configuration_kathleen import PAD_ID
from modeling_kathleen_notebook.kernels import fourier_kernels
from modeling_kathleen_notebook.notebook import Notebook
from modeling_kathleen_notebook.read_out import FourierReadOut, TableReadOut
from modeling_kathleen_notebook.scan_read import scan_and_read_chunked
from modeling_kathleen_notebook.scan_read_chunk import compiled_kernels


def chunked_with_gradients(notebook, ids_with_tail, beta, keep, memory, rho, grads_of):
    """Reads, end memory, and the gradients of β, keep, the start memory and ρ for random output weights."""
    inputs = [x.clone().requires_grad_() for x in (beta, keep, memory, rho)]
    reads, end = scan_and_read_chunked(notebook.tables(), ids_with_tail, *inputs)
    weights, end_weights = grads_of
    loss = (reads * weights).sum() + (torch.view_as_real(end) * end_weights).sum()
    return [reads, end, *torch.autograd.grad(loss, inputs)]


@pytest.mark.parametrize("period", [288, 259])
@pytest.mark.parametrize("key_binding", ["bundle", "bind"])
@pytest.mark.parametrize("T", [2, 7, 300])
def test_compiled_scan_and_read_equals_the_pytorch_blocks(T, key_binding, period, monkeypatch):
    """Chunks of 64 positions with forgetting (a start state and strided chunk views), B = 3, fp32, a window of
    padding only among the keys; [KR]'s bundled keys (formed in PyTorch) and the defaults' bound keys (formed
    inside the kernels, forward and backward, while the blocks form them in PyTorch); the Fourier period even (the
    default) and odd (checkpoints from before fourier_period): the kernels keep half of the bins, N // 2 + 1."""
    assert fourier_kernels() is not None, "the CPU kernel did not build (see the log): a compiler and ninja?"
    settings = dict(hrr_dim=64, scan_chunk=64, forgetting=True, fourier_period=period)
    notebook = Notebook(reference_config(**settings) if key_binding == "bundle" else KathleenConfig(**settings))
    g = torch.Generator().manual_seed(T)
    B, Fq, V = 3, 33, 259
    ids_with_tail = torch.randint(3, V, (B, notebook.tail_length + T), generator=g)
    ids_with_tail[0, :notebook.tail_length + 1] = PAD_ID
    beta, rho = torch.rand(B, T, generator=g), torch.rand(B, T, generator=g) + 0.5
    keep = 0.8 + 0.2 * torch.rand(B, T, generator=g)
    memory = torch.randn(B, Fq, generator=g, dtype=torch.complex64)
    grads_of = torch.randn(B, T, V, generator=g), torch.randn(B, Fq, 2, generator=g)
    args = notebook, ids_with_tail, beta, keep, memory, rho, grads_of

    reader = notebook.tables().reader
    assert compiled_kernels(reader, memory) is not None
    compiled = chunked_with_gradients(*args)
    monkeypatch.setenv("KATHLEEN_NOTEBOOK_KERNELS", "0")
    assert compiled_kernels(reader, memory) is None
    blocks = chunked_with_gradients(*args)
    for ours, theirs in zip(compiled, blocks):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4 * theirs.abs().max().item())


def test_only_the_fourier_read_of_complex64_spectra_on_a_cpu_is_compiled():
    g = torch.Generator().manual_seed(0)
    fourier = FourierReadOut(torch.randint(0, 16, (9,), generator=g), 16, 11, gain=1.0)
    table = TableReadOut(torch.randn(18, 11, generator=g))
    keys = torch.randn(2, 5, 9, dtype=torch.complex64)
    assert compiled_kernels(fourier, keys) is not None
    assert compiled_kernels(table, keys) is None
    assert compiled_kernels(fourier, keys.to(torch.complex128)) is None


def test_without_a_compiler_the_pytorch_path_runs(tmp_path):
    """A fresh process whose compiler does not exist and whose build cache is empty: the kernel is reported
    missing, and the notebook still reads (through its PyTorch blocks)."""
    code = (
        "import logging, torch\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM\n"
        "from modeling_kathleen_notebook.kernels import fourier_kernels\n"
        "assert fourier_kernels() is None\n"
        "model = KathleenForCausalLM(KathleenConfig(d_model=24, hrr_dim=256)).eval()\n"
        "print(model(torch.randint(3, 259, (1, 40))).logits.shape)\n"
    )

    root = pathlib.Path(__file__).resolve().parents[1]
    out = run_fresh_python(code, root, TORCH_EXTENSIONS_DIR=str(tmp_path), CXX=str(tmp_path / "no-compiler"))
    assert "torch.Size([1, 40, 259])" in out


@pytest.mark.parametrize("oracle_gate", [False, True])
@pytest.mark.parametrize("forgetting", [False, True])
def test_compiled_decoding_step_equals_the_pytorch_step(forgetting, oracle_gate, monkeypatch):
    """40 bytes decoded one at a time from an empty state (windows of padding first), B = 2: the compiled
    `notebook_step` and the PyTorch step give the same reads, memory and tail."""

    torch.manual_seed(0)
    notebook = Notebook(reference_config(d_model=24, hrr_dim=256, forgetting=forgetting, forget_logit_init=0.0))
    ids = torch.randint(3, 259, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = (torch.rand(2, 40, generator=torch.Generator().manual_seed(2)) > 0.5).float() if oracle_gate else None

    def decode():
        state, reads = None, []
        with torch.no_grad():
            for t in range(ids.shape[1]):
                read, state = notebook(ids[:, t:t + 1], None, state, None if mask is None else mask[:, t:t + 1])
                reads.append(read)
        return torch.cat(reads, dim=1), state

    compiled, compiled_state = decode()
    monkeypatch.setenv("KATHLEEN_NOTEBOOK_KERNELS", "0")
    pytorch, pytorch_state = decode()
    scale = pytorch.abs().max().item()
    assert scale > 0
    torch.testing.assert_close(compiled, pytorch, rtol=0, atol=1e-5 * scale)
    torch.testing.assert_close(compiled_state.spectrum, pytorch_state.spectrum, rtol=0,
                               atol=1e-5 * pytorch_state.spectrum.abs().max().item())
    assert torch.equal(compiled_state.tail, pytorch_state.tail)


def test_kernels_refuse_indices_outside_their_tables():
    """Ids index the value table inside C++: one out of range is an error that names it, not a stray read."""
    kernels = fourier_kernels()
    values, keys = torch.randn(5, 9, dtype=torch.complex64), torch.randn(1, 3, 9, dtype=torch.complex64)
    frequencies = torch.zeros(9, dtype=torch.long)
    none = torch.empty(0)
    with pytest.raises(RuntimeError, match="value ids outside"):
        kernels.scan_read_bins(values, torch.tensor([[0, 5]]), keys, none, none, none, torch.ones(1, 2), none,
                               frequencies, 16)
    with pytest.raises(RuntimeError, match="frequencies outside"):
        kernels.scan_read_bins(values, torch.tensor([[0, 4]]), keys, none, none, none, torch.ones(1, 2), none,
                               frequencies + 16, 16)
    residues, roots = torch.zeros(3, 9, dtype=torch.int16), torch.ones(2**16, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match=r"key ids \[B, C\+W\]"):  # bound keys formed inside: W + C ids a row
        kernels.scan_read_bins(values, torch.tensor([[0, 4]]), none.to(torch.complex64), torch.zeros(1, 4).long(),
                               residues, roots, torch.ones(1, 2), none, frequencies, 16)


@pytest.mark.parametrize("W", [1, 7, 8, 9, 17])
def test_bundled_keys_of_the_kernel_equal_the_embedding_bag_sums(W):
    """kernels.cpp's `bundled_keys` (rows added eight at a time, the norm in the same pass), which `bind` uses on a
    CPU, equals `bundled_keys_reference` (PyTorch's embedding-bag sum and norm), windows of padding included (zero
    key, scale 0); the controls: other row offsets change the keys, and an id past the table is refused."""
    notebook = Notebook(reference_config(hrr_dim=64, key_window=W))
    tables = notebook.tables()
    g = torch.Generator().manual_seed(W)
    n = 50
    ids = torch.randint(3, 259, (3, W + n), generator=g)
    ids[0, :W + 2] = PAD_ID  # windows of padding only, then windows partly padding
    ids[2, 20:20 + W + 3] = PAD_ID
    bindings = tables.bind(ids, n)
    keys, scales = fourier_kernels().bundled_keys(tables.key_rows, tables.row_offsets, ids)
    assert torch.equal(bindings.keys, keys) and torch.equal(bindings.key_scales, scales)  # what bind uses
    reference_keys, reference_scales = tables.bundled_keys_reference(ids.unfold(1, W, 1))
    torch.testing.assert_close(keys, reference_keys, rtol=1e-6, atol=1e-6 * reference_keys.abs().max().item())
    torch.testing.assert_close(scales, reference_scales, rtol=1e-5, atol=0)
    assert (scales == 0).sum() == (reference_scales == 0).sum() > 0
    shifted = fourier_kernels().bundled_keys(tables.key_rows, tables.row_offsets.roll(1), ids)[0]
    assert W == 1 or not torch.allclose(shifted, reference_keys, atol=1e-3)
    with pytest.raises(RuntimeError, match="key ids outside"):
        fourier_kernels().bundled_keys(tables.key_rows, tables.row_offsets, ids.clamp_min(259))


def test_bound_keys_formed_inside_the_kernels_equal_the_given_keys():
    """scan_read_bins and its backward with the bound keys formed from their window ids equal the same kernels
    given `bound_key_spectra`'s keys, exactly (the same roots, the same arithmetic afterwards); the control:
    other residues change the result."""
    notebook = Notebook(KathleenConfig(hrr_dim=64))
    tables = notebook.tables()
    g = torch.Generator().manual_seed(0)
    C, W = 40, notebook.config.key_window
    ids = torch.randint(3, 259, (2, W + C), generator=g)
    ids[0, :W + 3] = PAD_ID  # windows of padding, and windows partly padding
    bindings = tables.bind(ids, C)
    assert bindings.formed_keys is None  # the bound keys are not formed by binding
    formed = (bindings.keys, *[torch.empty(0)] * 3)
    inside = (torch.empty(0, dtype=torch.complex64), ids, tables.key_residues, tables.roots)
    coeff, start = torch.rand(2, C, generator=g), torch.randn(2, 33, generator=g, dtype=torch.complex64)
    reader = tables.reader
    grad_bins = torch.randn(2, C, reader.period // 2 + 1, generator=g, dtype=torch.complex64)
    kernels = fourier_kernels()

    def run(keys):
        common = (tables.write_values, bindings.value_ids, *keys)
        bins, end = kernels.scan_read_bins(*common, coeff, start, reader.frequencies, reader.period)
        return bins, end, *kernels.scan_read_bins_backward(*common, grad_bins, end, reader.frequencies,
                                                           reader.period)

    for ours, given in zip(run(inside), run(formed)):
        assert torch.equal(ours, given)
    other = (inside[0], ids, tables.key_residues.roll(1, dims=1), tables.roots)
    assert not torch.equal(run(other)[0], run(formed)[0])


def test_a_dead_build_lock_is_removed_and_a_live_one_waited_for(tmp_path, monkeypatch, caplog):
    """A lock left by a process killed mid-build is removed (torch itself would wait on it forever); a younger one
    is waited for until it is released, and only removed once it has grown stale."""

    lock = tmp_path / "lock"
    lock.touch()
    os.utime(lock, (time.time() - 2 * kernels.STALE_BUILD_SECONDS,) * 2)
    kernels.clear_stale_build_lock(lock)
    assert not lock.exists() and "stale build lock" in caplog.text

    lock.touch()  # a live build: released by its owner after 1 s
    threading.Timer(1.0, lock.unlink).start()
    started = time.monotonic()
    kernels.clear_stale_build_lock(lock)
    assert time.monotonic() - started >= 0.9, "a live build's lock was not waited for"

    monkeypatch.setattr(kernels, "STALE_BUILD_SECONDS", 1.5)
    lock.touch()  # a lock that nobody releases is removed once stale, not waited on forever
    started = time.monotonic()
    kernels.clear_stale_build_lock(lock)
    assert not lock.exists() and 1.0 <= time.monotonic() - started < 10


def test_a_lock_whose_named_process_is_gone_is_removed_at_once(tmp_path, monkeypatch, caplog):
    """`build` names the process that takes the lock beside it: a young lock whose process has died (killed while it
    held it, so torch's own release never ran) is removed at once, not after STALE_BUILD_SECONDS; one whose process
    still runs, or that names another host, is waited for (the controls)."""
    monkeypatch.setattr(kernels, "STALE_BUILD_SECONDS", 3.0)  # a lock is young for 3 s here
    lock = tmp_path / "lock"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that existed and has ended
    lock.touch()
    kernels.lock_holder(lock).write_text(f"{platform.node()} {gone.pid}")
    started = time.monotonic()
    kernels.clear_stale_build_lock(lock)
    assert not lock.exists() and time.monotonic() - started < 0.5 and "is gone" in caplog.text
    for holder in (f"{platform.node()} {os.getpid()}", f"another-host {gone.pid}"):
        lock.touch()
        kernels.lock_holder(lock).write_text(holder)
        threading.Timer(1.0, lock.unlink).start()
        started = time.monotonic()
        kernels.clear_stale_build_lock(lock)
        assert time.monotonic() - started >= 0.9, f"a lock held by {holder!r} was not waited for"


def test_a_fresh_process_loads_the_kernels_at_once_past_a_killed_processs_lock(tmp_path):
    """A process killed while it held the build cache's lock (a load's, as `timeout` does to a run): the next
    process loads the kernels without waiting for the lock to grow stale (STALE_BUILD_SECONDS, 10 minutes)."""
    assert fourier_kernels() is not None
    lock = kernels.build_lock(kernels.build_name(kernels.source_path().read_text()))
    code = ("import os, signal\n"
            "from modeling_kathleen_notebook import kernels\n"
            "from torch.utils import cpp_extension\n"
            "def killed(*args, **kwargs):  # the lock taken, then killed before torch releases it\n"
            "    open(kernels.build_lock(kernels.build_name(kernels.source_path().read_text())), 'w').close()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "cpp_extension.load_inline = killed\n"
            "kernels.fourier_kernels()\n")
    root = pathlib.Path(__file__).resolve().parents[1]
    killed = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    try:  # (another test's fresh process may find the lock first and remove it the same way)
        started = time.monotonic()
        load = ("from modeling_kathleen_notebook.kernels import fourier_kernels\n"
                "print('loaded' if fourier_kernels() is not None else 'missing')")
        loaded = subprocess.run([sys.executable, "-c", load], cwd=root, capture_output=True, text=True, timeout=120)
        assert "loaded" in loaded.stdout and time.monotonic() - started < 60, loaded.stderr[-2000:]
    finally:
        lock.unlink(missing_ok=True)


def test_a_fresh_process_loads_the_kernels_past_a_dead_build_lock():
    """The build cache's own lock, left by a killed process: a new process still gets the kernels."""

    assert fourier_kernels() is not None
    lock = kernels.build_lock(kernels.build_name(kernels.source_path().read_text()))
    assert lock is not None and lock.parent.is_dir()
    lock.touch()
    os.utime(lock, (time.time() - 2 * kernels.STALE_BUILD_SECONDS,) * 2)
    try:
        code = ("from modeling_kathleen_notebook.kernels import fourier_kernels\n"
                "print('loaded' if fourier_kernels() is not None else 'missing')\n")
        assert "loaded" in run_fresh_python(code, pathlib.Path(__file__).resolve().parents[1])
    finally:
        lock.unlink(missing_ok=True)
