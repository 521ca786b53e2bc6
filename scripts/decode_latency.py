"""Per-byte decoding latency: the compiled step (decode_step.py) against the PyTorch step in one process, and
optionally this checkout against another git revision of the package.

    python scripts/decode_latency.py [--contexts 1024 65536] [--against REV] [--rounds 2] [--threads 1] [--seed 0]
        [--notebook defaults|kr] [--model CHECKPOINT] [--breakdown]

Each measurement process builds a KathleenConfig model (d 96 x 2 blocks + notebook, R 2,048: the package's defaults,
or with --notebook kr [KR]'s notebook, `KR_NOTEBOOK`: bundled keys, the gate, forgetting) from --seed, or loads
--model (the shipped checkpoint, say), reads
a context of random bytes, then steps single bytes: 64 untimed, then rounds of 200 timed steps alternating
between the compiled step and the PyTorch step (KATHLEEN_FUSED_DECODE=0), so machine noise hits both alike;
the median per byte of each is printed with their ratio. With --against, the package as it was at REV (`git
archive`) is measured in its own processes, alternating with this checkout's. --breakdown times, in this checkout's
compiled steps, what a decoded byte is made of: the whole model call, `fused_step` inside it, the compiled
kernel inside that, and the notebook's inputs (timers wrapped around each; the rest is Python around them).
"""

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from modeling_kathleen_notebook.configuration_kathleen import KR_NOTEBOOK

ROOT = Path(__file__).resolve().parents[1]
MEASURE = """
import os, statistics, time, torch
torch.set_num_threads({threads})
from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
torch.manual_seed({seed})
model = {build}.eval()
ids = torch.randint(3, 259, (1, {context} + 64 + 200 * {rounds} * 2), generator=torch.Generator().manual_seed({seed}))
times = {{"1": [], "0": []}}
with torch.no_grad():
    cache = model(ids[:, :{context}], logits_to_keep=1).cache
    t = {context}
    for _ in range(64):
        cache = model(ids[:, t:t + 1], cache=cache).cache
        t += 1
    for _ in range({rounds}):
        for fused in ("1", "0"):
            os.environ["KATHLEEN_FUSED_DECODE"] = fused
            for _ in range(200):
                start = time.perf_counter()
                cache = model(ids[:, t:t + 1], cache=cache).cache
                times[fused].append(time.perf_counter() - start)
                t += 1
print(statistics.median(times["1"]) * 1e3, statistics.median(times["0"]) * 1e3)
"""

BREAKDOWN = """
import statistics, time, torch
torch.set_num_threads({threads})
from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
from modeling_kathleen_notebook import decode_step, modeling_kathleen
times = {{"model call": [], "fused_step": [], "kernel": [], "notebook inputs": []}}

def timed(name, fn):
    def run(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        times[name].append(time.perf_counter() - start)
        return out
    return run

class TimedKernels:
    def __init__(self, kernels):
        self.decode_step = timed("kernel", kernels.decode_step)

decode_step.notebook_inputs = timed("notebook inputs", decode_step.notebook_inputs)
modeling_kathleen.fused_step = timed("fused_step", decode_step.fused_step)
torch.manual_seed({seed})
model = {build}.eval()
ids = torch.randint(3, 259, (1, {context} + 64 + 200 * {rounds}), generator=torch.Generator().manual_seed({seed}))
with torch.no_grad():
    cache = model(ids[:, :{context}], logits_to_keep=1).cache
    for t in range({context}, {context} + 64):
        cache = model(ids[:, t:t + 1], cache=cache).cache
    weights = decode_step.DecodeWeights.of(model)
    weights.kernels = TimedKernels(weights.kernels)
    for values in times.values():
        values.clear()
    call = timed("model call", model)
    for t in range({context} + 64, ids.shape[1]):
        cache = call(ids[:, t:t + 1], cache=cache).cache
assert len(times["kernel"]) == 200 * {rounds}, "the compiled step did not run"
print(" ".join(f"{{name.replace(' ', '_')}}={{statistics.median(values) * 1e3:.4f}}" for name, values in times.items()
               if values))
"""


def run_measurement(template: str, package_parent: Path, context: int, args) -> str:
    """The last line printed by `template` run in a fresh process on the package in `package_parent`."""
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    settings = KR_NOTEBOOK if args.notebook == "kr" else {}  # a literal: another revision may lack KR_NOTEBOOK
    build = (f"KathleenForCausalLM.from_pretrained({str(Path(args.model).resolve())!r})" if args.model
             else f"KathleenForCausalLM(KathleenConfig(**{settings}))")
    code = template.format(threads=args.threads, seed=args.seed, context=context, rounds=args.rounds, build=build)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=package_parent, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the measurement process failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def measure(package_parent: Path, context: int, args) -> tuple[float, float]:
    """(compiled, PyTorch) ms per byte after `context` bytes; a revision without the compiled step gives two
    PyTorch figures."""
    compiled, pytorch = run_measurement(MEASURE, package_parent, context, args).split()
    return float(compiled), float(pytorch)


def breakdown(context: int, args) -> dict[str, float]:
    """This checkout's compiled step after `context` bytes: median ms per byte of each timed part."""
    parts = run_measurement(BREAKDOWN, ROOT, context, args).split()
    return {name.replace("_", " "): float(value) for name, value in (part.split("=") for part in parts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", help="a git revision to compare with")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 65536])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of 200 steps per path")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--notebook", choices=["defaults", "kr"], default="defaults",
                        help="the package's default notebook, or [KR]'s (KR_NOTEBOOK)")
    parser.add_argument("--model", help="a checkpoint folder to measure instead of a KathleenConfig model "
                        "(e.g. modeling_kathleen_notebook/pretrained/kathleen-notebook-0.5m)")
    parser.add_argument("--breakdown", action="store_true",
                        help="time the parts of this checkout's compiled step instead (model call, fused_step, kernel, "
                        "notebook inputs)")
    args = parser.parse_args()
    if args.model and not Path(args.model, "config.json").exists():
        parser.error(f"--model {args.model}: no config.json there")
    if args.breakdown and args.against:
        parser.error("--breakdown times this checkout only: leave out --against")
    with tempfile.TemporaryDirectory() as scratch:
        checkouts = {"this checkout": ROOT}
        if args.against:
            archive = Path(scratch) / "package.tar"
            subprocess.run(["git", "archive", "-o", str(archive), args.against, "modeling_kathleen_notebook"],
                           cwd=ROOT, check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(Path(scratch) / "old", filter="data")
            checkouts[args.against] = Path(scratch) / "old"
        built = "KathleenConfig()" if args.notebook == "defaults" else "KathleenConfig(**KR_NOTEBOOK)"
        model = f"checkpoint {args.model}" if args.model else f"{built} (d 96 x 2, R 2,048)"
        print(f"{args.threads} thread(s), seed {args.seed}, {model}, batch 1; "
              f"median of {200 * args.rounds} single-byte steps per path")
        if args.breakdown:
            for context in args.contexts:
                parts = breakdown(context, args)
                print(f"  after {context:,} bytes, ms per byte: " + ", ".join(f"{name} {value:.4f}"
                                                                           for name, value in parts.items()))
            return
        for context in args.contexts:
            for name, parent in checkouts.items():
                compiled, pytorch = measure(parent, context, args)
                print(f"  {name}, after {context:,} bytes: compiled step {compiled:.3f} ms/byte, PyTorch step "
                      f"{pytorch:.3f} ms/byte ({pytorch / compiled:.1f}x)")


if __name__ == "__main__":
    main()
