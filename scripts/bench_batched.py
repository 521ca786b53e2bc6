"""Batched decoding throughput: bytes/s of single-byte steps at batch 1, 8 and 64 after contexts of 1K and 16K bytes,
for our notebook model (what a model call does, and its PyTorch step alone) and the parameter-matched
Llama (KV cache) and Mamba of scripts/bench.py, in one process.

    python scripts/bench_batched.py [--threads 1] [--seed 42] [--batches 1 8 64] [--contexts 1024 16384]
        [--steps 16] [--out reports/bench_batched]

Each model reads the context once (batch 1); the cache is then repeated to the batch size
(`batch_repeat_interleave`, what `generate` does for several sequences per prompt): a step's work does not depend
on the rows' contents. Per model, batch and context: the median of --steps timed steps after 4 untimed ones, the
models taking turns. bytes/s = batch / step time. Writes OUT.md with the table, the ratios against Llama and the
command.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import build_models, prefill  # noqa: E402

from modeling_kathleen_notebook.cache import RecurrentCache  # noqa: E402
from modeling_kathleen_notebook.experiments.mqar import state_bytes  # noqa: E402
from modeling_kathleen_notebook.kernels import notebook_path  # noqa: E402

ARMS = ("trunk+notebook", "mamba", "llama")
PYTORCH_STEP = "trunk+notebook (PyTorch step)"  # the same model with decode_step.py's compiled step switched off
WARMUP = 4


@contextlib.contextmanager
def compiled_step(on: bool):
    """KATHLEEN_FUSED_DECODE for the steps inside (decode_step.enabled() reads it at every step)."""
    before = os.environ.get("KATHLEEN_FUSED_DECODE")
    os.environ["KATHLEEN_FUSED_DECODE"] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["KATHLEEN_FUSED_DECODE"]
        else:
            os.environ["KATHLEEN_FUSED_DECODE"] = before


def repeat_rows(cache, batch: int):
    """The cache with each row repeated `batch` times. Transformers' linear-attention layers (Mamba's) have no
    batch_repeat_interleave, so their tensors (batch first) are repeated here."""
    if isinstance(cache, RecurrentCache):
        cache.batch_repeat_interleave(batch)
        return cache
    for layer in cache.layers:
        for name, value in vars(layer).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                setattr(layer, name, value.repeat_interleave(batch, dim=0))
            elif isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(item, torch.Tensor) and item.dim() > 0:
                        value[key] = item.repeat_interleave(batch, dim=0)
    return cache


@torch.no_grad()
def step_times(model, cache, batch: int, steps: int, seed: int) -> list[float]:
    """Seconds of each of `steps` single-byte steps of the whole batch after WARMUP untimed ones."""
    ids = torch.randint(3, 259, (batch, WARMUP + steps), generator=torch.Generator().manual_seed(seed))
    times = []
    for t in range(WARMUP + steps):
        start = time.perf_counter()
        cache = model(ids[:, t:t + 1], cache=cache, use_cache=True).cache
        if t >= WARMUP:
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 16384])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--out", default="reports/bench_batched")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {name: model.eval() for name, model in build_models(args.seed).items() if name in ARMS}
    models[PYTORCH_STEP] = models["trunk+notebook"]
    rates, sizes = {}, {}
    for context in args.contexts:
        ids = torch.randint(3, 259, (1, context), generator=torch.Generator().manual_seed(args.seed))
        prefilled = {name: prefill(model, ids) for name, model in models.items()}
        for batch in args.batches:
            for name, model in models.items():
                cache = repeat_rows(copy.deepcopy(prefilled[name]), batch)
                sizes[name, context, batch] = state_bytes(cache)
                with compiled_step(name != PYTORCH_STEP):
                    median = statistics.median(step_times(model, cache, batch, args.steps, args.seed))
                rates[name, context, batch] = batch / median
                print(f"{name:>15} context {context:>6} batch {batch:>3}: {rates[name, context, batch]:>10,.0f} "
                      f"bytes/s ({median * 1e3:.2f} ms per step, state {sizes[name, context, batch]:,} bytes)",
                      flush=True)
            del cache
        del prefilled
    write_report(args, models, rates, sizes)


def write_report(args, models: dict, rates: dict, sizes: dict) -> None:
    command = "python scripts/bench_batched.py " + " ".join(
        [f"--threads {args.threads}", f"--seed {args.seed}", "--batches " + " ".join(map(str, args.batches)),
         "--contexts " + " ".join(map(str, args.contexts)), f"--steps {args.steps}"])
    parameters = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items() if name != PYTORCH_STEP}
    lines = ["# Batched decoding throughput", "",
             f"Single-byte steps after a context, bytes/s = batch / median step time ({args.steps} timed steps after "
             f"{WARMUP} untimed, models taking turns), {args.threads} thread(s), seed {args.seed}, the notebook's "
             f"{notebook_path()}; trunk+notebook is what a model call does (the compiled step where it applies). "
             "Parameters: "
             + ", ".join(f"{n} {p:,}" for n, p in parameters.items()) + ".", "",
             "```", command, "```", "",
             "| context | batch | " + " | ".join(f"{n} bytes/s" for n in models) + " | "
             + " | ".join(f"{n} state" for n in models) + " | ours / llama |",
             "|---|---|" + "---|" * (2 * len(models) + 1)]
    for context in args.contexts:
        for batch in args.batches:
            ratio = rates["trunk+notebook", context, batch] / rates["llama", context, batch]
            lines.append(f"| {context:,} | {batch} | " + " | ".join(f"{rates[n, context, batch]:,.0f}" for n in models)
                         + " | " + " | ".join(f"{sizes[n, context, batch] / 2**10:,.0f} KiB" for n in models)
                         + f" | {ratio:.2f}× |")
    target_context, target_batch = max(args.contexts), max(args.batches)
    ratio = rates["trunk+notebook", target_context, target_batch] / rates["llama", target_context, target_batch]
    verdict = "met" if ratio >= 10 else f"missed by {10 - ratio:.2f}×"
    lines += ["", f"Issue 22's target, batch {target_batch} at {target_context:,} bytes: ≥ 10× the parameter-matched "
              f"Llama's bytes/s. Measured {ratio:.2f}× ({verdict})."]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
