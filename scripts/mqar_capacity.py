"""The notebook's MQAR capacity with an oracle write gate: where recall ends as pairs grow, per memory size R.

    python scripts/mqar_capacity.py [--dims 1024 2048 4096] [--pairs 4 8 16 32 64 128 256] \
        [--lengths 256 1024 4096 16384] [--examples 8] [--seed 0] [--out reports/mqar_capacity]

An untrained notebook (no forgetting, bound keys; `--key-binding bundle` for [KR]'s keys) writes exactly the value
bytes of the "<MARK>keyvalue" pairs (the oracle mask) and is read out alone (memory logits, teacher-forced) at each
query's value bytes (modeling_kathleen_notebook/experiments/mqar.py). This measures the memory, not a trained model:
it is the ceiling a trained notebook's write gate can reach at that R, and no comparison with trained arms (issue
19). Three curves: recall against K at 8,192 bytes; recall against length at K = 8; and for 8 of 16 keys
reassigned at 4,096 bytes, recall of the latest value with both values in memory and after an explicit update (the
stale pair unlearned through NotebookSession). 1 thread; the seed fixes models and examples.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
from pathlib import Path

import torch

from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
from modeling_kathleen_notebook.experiments.mqar import MQARExample, make_mqar_example, recall_after_reading
from modeling_kathleen_notebook.experiments.needle import CONTEXT_BYTES

CAPACITY_LENGTH, LENGTH_PAIRS = 8192, 8
REASSIGN_LENGTH, REASSIGN_PAIRS, REASSIGNED = 4096, 16, 8


@torch.no_grad()
def oracle_recall(model: KathleenForCausalLM, example: MQARExample) -> float:
    out = model(example.input_ids[None], write_mask=example.write_mask()[None], use_cache=False)
    return example.value_accuracy(out.memory_logits[0])


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--pairs", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--examples", type=int, default=8)
    parser.add_argument("--key-binding", choices=["bind", "bundle"], default="bind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="reports/mqar_capacity")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for R in args.dims:
        torch.manual_seed(args.seed)
        model = KathleenForCausalLM(KathleenConfig(forgetting=False, d_model=32, n_layers=1, hrr_dim=R,
                                                   key_binding=args.key_binding, key_window=CONTEXT_BYTES)).eval()
        rng = random.Random(args.seed)
        row = {"state_bytes": (R // 2 + 1) * 8,  # the memory's complex64 spectrum; the 6-byte key tail aside
               "by_pairs": {K: mean([oracle_recall(model, make_mqar_example(CAPACITY_LENGTH, K, rng))
                                     for _ in range(args.examples)]) for K in args.pairs},
               "by_length": {L: mean([oracle_recall(model, make_mqar_example(L, LENGTH_PAIRS, rng))
                                      for _ in range(args.examples)]) for L in args.lengths}}
        reassigned = [make_mqar_example(REASSIGN_LENGTH, REASSIGN_PAIRS, rng, n_reassigned=REASSIGNED)
                      for _ in range(args.examples)]
        row["reassigned_superposed"] = mean([recall_after_reading(model, e, False) for e in reassigned])
        row["reassigned_updated"] = mean([recall_after_reading(model, e, True) for e in reassigned])
        results[R] = row
        print(f"R = {R}: {json.dumps(row)}", flush=True)
    write_report(args, results)


def write_report(args, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# MQAR capacity of the notebook with an oracle write gate (issue 19)", "",
             "An untrained notebook writes exactly the pairs' value bytes and is read out alone; this is the memory's "
             "ceiling at each R, not a trained arm (modeling_kathleen_notebook/experiments/mqar.py, "
             f"{args.key_binding} keys, no forgetting, {args.examples} sequences per cell, seed {args.seed}).", "",
             "Command (1 thread):", "", "```", "python " + shlex.join(sys.argv), "```", "",
             f"Value-byte recall against the number of pairs K, at {CAPACITY_LENGTH:,} bytes:", "",
             "| R | state bytes | " + " | ".join(f"K = {K}" for K in args.pairs) + " |",
             "|---|---|" + "---|" * len(args.pairs)]
    for R, row in results.items():
        lines.append(f"| {R:,} | {row['state_bytes']:,} | "
                     + " | ".join(f"{row['by_pairs'][K]:.3f}" for K in args.pairs) + " |")
    lines += ["", f"Against sequence length, K = {LENGTH_PAIRS}:", "",
              "| R | " + " | ".join(f"{L:,} bytes" for L in args.lengths) + " |", "|---|" + "---|" * len(args.lengths)]
    for R, row in results.items():
        lines.append(f"| {R:,} | " + " | ".join(f"{row['by_length'][L]:.3f}" for L in args.lengths) + " |")
    lines += ["", f"Reassigned keys ({REASSIGNED} of {REASSIGN_PAIRS} written again with a new value, "
              f"{REASSIGN_LENGTH:,} bytes), recall of the latest value:", "",
              "| R | both values in memory | explicit update (stale pair unlearned) |", "|---|---|---|"]
    for R, row in results.items():
        lines.append(f"| {R:,} | {row['reassigned_superposed']:.3f} | {row['reassigned_updated']:.3f} |")
    ends = {R: next((K for K in args.pairs if row["by_pairs"][K] < 0.9), None) for R, row in results.items()}
    lines += ["", "Capacity (the first K with recall below 0.90): "
              + "; ".join(f"R = {R:,}: " + (f"K = {K}" if K else f"beyond K = {args.pairs[-1]}")
                          for R, K in ends.items()) + "."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({str(R): row for R, row in results.items()}, indent=1))

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    for R, row in results.items():
        label = f"R = {R:,} ({row['state_bytes']:,} B)"
        left.plot(args.pairs, [row["by_pairs"][K] for K in args.pairs], marker="o", label=label)
        right.plot(args.lengths, [row["by_length"][L] for L in args.lengths], marker="o", label=label)
    left.set(xscale="log", xlabel=f"pairs K (at {CAPACITY_LENGTH:,} bytes)", ylabel="value-byte recall", ylim=(0, 1.05))
    right.set(xscale="log", xlabel=f"sequence length, bytes (K = {LENGTH_PAIRS})", ylim=(0, 1.05))
    left.axhline(0.9, color="grey", lw=0.8, ls="--")
    left.legend(fontsize=8)
    figure.suptitle("Notebook MQAR with an oracle write gate (untrained: the memory's ceiling)")
    figure.savefig(out.with_suffix(".png"), dpi=120)
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
