"""The repeat probe of SPEC §6.2 over several trained arms; writes a markdown report and a PNG.

    python scripts/repeat_probe.py \
        --arm trunk=runs/probe-none/final --arm notebook-no-forgetting=runs/probe-noforget/final \
        --arm notebook=runs/probe-notebook/final --arm attention=runs/probe-attention/final \
        --file ../shared/data/enwiki_excerpt.xml --byte-range 5480771 6089746 \
        --lengths 512 2048 4096 --baseline trunk --out reports/repeat_probe

Defaults: 1 thread, the enwiki test split. Every number in the report is computed here, exactly
(no sampling); the command line is written into the report.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import modeling_kathleen_notebook  # noqa: F401  registers the Auto classes
from modeling_kathleen_notebook.experiments.repeat_probe import DISTANCE_BINS, probe

BIN_NAMES = [f"{lo}-{hi or 'inf'}" for lo, hi in DISTANCE_BINS]


def gain(row: dict, key: str = "") -> float:
    return row["bpb_first"] - row[f"bpb_repeat{key}"]


def first_mention_cost(row: dict, ref: dict) -> str:
    """first_arm - first_baseline, and for a notebook arm its shares: its own trunk's read-out against the
    baseline, then what the notebook's read adds."""
    cost = f"{row['bpb_first'] - ref['bpb_first']:+.4f}"
    if "bpb_first_trunk_readout" not in row:
        return cost
    trunk = row["bpb_first_trunk_readout"] - ref["bpb_first"]
    return f"{cost} (trunk {trunk:+.4f}, read {row['bpb_first'] - row['bpb_first_trunk_readout']:+.4f})"


def signed(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", action="append", required=True, help="NAME=checkpoint folder")
    parser.add_argument("--file", default="../shared/data/enwiki_excerpt.xml")
    parser.add_argument("--byte-range", type=int, nargs=2, default=[5_480_771, 6_089_746])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--baseline", default="trunk")
    parser.add_argument("--train-length", type=int, default=512, help="for the 'x training length' column")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="reports/repeat_probe")
    parser.add_argument("--reuse", action="store_true", help="keep results already in OUT.json for the same arm")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = Path(args.file).read_bytes()[args.byte_range[0]:args.byte_range[1]]
    arms = dict(item.split("=", 1) for item in args.arm)
    if args.baseline not in arms:
        raise SystemExit(f"--baseline {args.baseline} is not among the arms {sorted(arms)}")

    results, saved = {}, {}
    if args.reuse and Path(args.out).with_suffix(".json").exists():
        saved = json.loads(Path(args.out).with_suffix(".json").read_text())
    for name, path in arms.items():
        if all(f"{name}@{length}" in saved for length in args.lengths):
            results.update({(name, length): saved[f"{name}@{length}"] for length in args.lengths})
            continue
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        for length in args.lengths:
            start = time.perf_counter()
            results[name, length] = probe(model, data, length, with_gate=model.config.memory == "notebook")
            print(f"{name} @ {length}: {json.dumps(results[name, length])} ({time.perf_counter() - start:.0f}s)",
                  flush=True)
    write_report(args, arms, results, len(data))


def write_report(args, arms: dict, results: dict, n_bytes: int) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    base = args.baseline
    lines = [
        "# Repeat probe (SPEC §6.2)", "",
        f"Text: `{args.file}` bytes [{args.byte_range[0]:,}, {args.byte_range[1]:,}) ({n_bytes:,} bytes), cut into "
        "non-overlapping windows, each scored from an empty state. Words: runs of >= 4 letters; a repeat's most "
        "recent earlier occurrence in the window starts >= 64 bytes before it. "
        f"Gains are relative to `{base}`: extra repeat gain = (first - repeat)_arm - (first - repeat)_{base}; "
        f"first-mention cost = first_arm - first_{base} (bits/byte); for a notebook arm, in brackets, its shares: "
        f"its own trunk's read-out - first_{base}, then the arm - its trunk's read-out.", "",
        "Command (1 thread, exact, no sampling):", "", "```", "python " + shlex.join(sys.argv), "```", "",
        "| arm | L | x train | bpb | first | repeat | extra gain | " + " | ".join(f"gain {b}" for b in BIN_NAMES)
        + " | first-mention cost | β repeat / other |",
        "|---|---|---|---|---|---|---|" + "---|" * len(BIN_NAMES) + "---|---|",
    ]
    for name in arms:
        for length in args.lengths:
            row, ref = results[name, length], results[base, length]
            bins = [gain(row, f"_{b}") - gain(ref, f"_{b}") for b in BIN_NAMES]
            beta = f"{row['beta_repeat']:.3f} / {row['beta_other']:.3f}" if "beta_repeat" in row else "-"
            lines.append(
                f"| {name} | {length} | {length / args.train_length:g}x | {row['bpb']:.4f} | {row['bpb_first']:.4f} | "
                f"{row['bpb_repeat']:.4f} | {gain(row) - gain(ref):+.4f} | "
                + " | ".join(signed(g) for g in bins)
                + f" | {first_mention_cost(row, ref)} | {beta} |")
    lines += ["", "Targets (issue 6) for the notebook with forgetting, at 4x and 8x:", ""]
    for length in args.lengths:
        if "notebook" not in arms or length < 4 * args.train_length:
            continue
        row, ref = results["notebook", length], results[base, length]
        bins = {b: gain(row, f"_{b}") - gain(ref, f"_{b}") for b in BIN_NAMES}
        negative = {b: g for b, g in bins.items() if not g > 0}
        cost = row["bpb_first"] - ref["bpb_first"]
        misses = ", ".join(f"{b} ({g:+.4f})" for b, g in negative.items())
        lines.append(f"- L = {length}: gain positive in every distance bin: "
                     + ("met" if not negative else f"missed in {misses}")
                     + f"; first-mention cost {cost:+.4f} (target <= +0.01: {'met' if cost <= 0.01 else 'missed'})"
                     + f"; overall {row['bpb']:.4f} vs trunk {ref['bpb']:.4f} "
                     + f"({'no worse: met' if row['bpb'] <= ref['bpb'] else 'worse: missed'})")
    counts = results[base, args.lengths[0]]
    lines += ["", f"Bytes per class at L={args.lengths[0]}: first mentions {counts['first_bytes']:,}, repeats "
              f"{counts['repeat_bytes']:,} (" + ", ".join(f"{b}: {counts[f'repeat_bytes_{b}']:,}" for b in BIN_NAMES)
              + ")."]
    (out.with_suffix(".md")).write_text("\n".join(lines) + "\n")
    (out.with_suffix(".json")).write_text(json.dumps({f"{k[0]}@{k[1]}": v for k, v in results.items()}, indent=1))
    plot(args, arms, results, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.png')}")


def plot(args, arms: dict, results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [name for name in arms if name != args.baseline]
    figure, axes = plt.subplots(1, len(args.lengths), figsize=(4 * len(args.lengths), 3.6), sharey=True)
    axes = [axes] if len(args.lengths) == 1 else axes
    width = 0.8 / max(1, len(others))
    for axis, length in zip(axes, args.lengths):
        ref = results[args.baseline, length]
        for i, name in enumerate(others):
            row = results[name, length]
            values = [gain(row, f"_{b}") - gain(ref, f"_{b}") for b in BIN_NAMES]
            values = [0.0 if math.isnan(v) else v for v in values]
            axis.bar([j + i * width for j in range(len(BIN_NAMES))], values, width, label=name)
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_xticks([j + width * (len(others) - 1) / 2 for j in range(len(BIN_NAMES))], BIN_NAMES)
        axis.set_title(f"L = {length} ({length / args.train_length:g}x train)")
        axis.set_xlabel("repeat distance (bytes)")
    axes[0].set_ylabel(f"extra repeat gain vs {args.baseline} (bits/byte)")
    axes[-1].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()
