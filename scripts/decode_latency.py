"""Per-byte decoding latency of this checkout, optionally against another git revision of the package.

    python scripts/decode_latency.py [--against REV] [--rounds 2] [--threads 1] [--seed 0]

Each measurement is a fresh process: a default KathleenConfig model (d 96 x 2 blocks + notebook) built
from --seed reads 1,024 random bytes, then steps 1,176 single bytes; the median of the last 1,126 steps
is printed. With --against, the package as it was at REV (`git archive`) is measured in alternating
rounds with this checkout, so machine noise hits both alike.
"""

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURE = """
import statistics, sys, time, torch
torch.set_num_threads({threads})
from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
torch.manual_seed({seed})
model = KathleenForCausalLM(KathleenConfig()).eval()
ids = torch.randint(3, 259, (1, 2200), generator=torch.Generator().manual_seed({seed}))
times = []
with torch.no_grad():
    cache = model(ids[:, :1024]).cache
    for t in range(1024, 2200):
        start = time.perf_counter()
        cache = model(ids[:, t:t + 1], cache=cache).cache
        times.append(time.perf_counter() - start)
print(statistics.median(times[50:]) * 1e3)
"""


def measure(package_parent: Path, args) -> float:
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    code = MEASURE.format(threads=args.threads, seed=args.seed)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=package_parent, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", help="a git revision to compare with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        checkouts = {"this checkout": ROOT}
        if args.against:
            archive = Path(scratch) / "package.tar"
            subprocess.run(["git", "archive", "-o", str(archive), args.against, "modeling_kathleen_notebook"],
                           cwd=ROOT, check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(Path(scratch) / "old", filter="data")
            checkouts[args.against] = Path(scratch) / "old"
        results = {name: [] for name in checkouts}
        for _ in range(args.rounds):
            for name, parent in checkouts.items():
                results[name].append(measure(parent, args))
    print(f"{args.threads} thread(s), seed {args.seed}, 1,024-byte context, median of 1,126 single-byte steps")
    for name, values in results.items():
        print(f"  {name}: " + " / ".join(f"{v:.3f}" for v in values) + " ms/byte")


if __name__ == "__main__":
    main()
