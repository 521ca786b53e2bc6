"""Compare training runs on held-out text: test-split bits/byte of each run's final model, next to the
compressors, with the training curves in one PNG. Writes reports/<name>.md and .png.

    python scripts/report_training.py --run trunk=runs/text-none --run notebook=runs/text-notebook \
        --name training [--data ../shared/data/enwiki_excerpt.xml] [--window 2048]

Test split = enwiki bytes [5,480,771, 6,089,746) (shared data README); scored exactly, one stream and
independent windows; 1 thread.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from modeling_kathleen_notebook import KathleenForCausalLM
from modeling_kathleen_notebook.scoring import bits_per_byte
from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

TEST_SPLIT = (5_480_771, 6_089_746)
COMPRESSORS = "xz -9e 2.125, bz2 -9 2.228, zlib -9 2.770 bits/byte (whole file, in-sample; shared data README)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, help="NAME=output_dir of a training run")
    parser.add_argument("--name", default="training")
    parser.add_argument("--data", default="../shared/data/enwiki_excerpt.xml")
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--train-command", action="append", default=[], help="the command behind a run (repeatable)")
    parser.add_argument("--note", action="append", default=[], help="a paragraph for the report (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    test = bytes_to_ids(Path(args.data).read_bytes()[TEST_SPLIT[0]:TEST_SPLIT[1]])
    rows, curves = [], {}
    for item in args.run:
        name, folder = item.split("=", 1)
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        model = KathleenForCausalLM.from_pretrained(folder / "final").eval()
        start = time.perf_counter()
        stream = bits_per_byte(model, test)
        windows = bits_per_byte(model, test, window=args.window)
        last = metrics[-1]
        rows.append({"name": name, "parameters": sum(p.numel() for p in model.parameters()), "steps": last["step"],
                     "minutes": last["minutes"],
                     "train": config["train"], "memory": config["model"].get("memory"),
                     "stream": stream, "windows": windows,
                     "val": [r["eval_bpb"] for r in metrics if "eval_bpb" in r][-1]})
        curves[name] = metrics
        print(f"{name}: test {stream:.4f} (stream) / {windows:.4f} (windows {args.window}) "
              f"[{time.perf_counter() - start:.0f}s]", flush=True)
    write(args, rows, curves, len(test))


def write(args, rows: list[dict], curves: dict, n_test: int) -> None:
    out = Path("reports") / args.name
    out.parent.mkdir(exist_ok=True)
    lines = [f"# Training on enwiki: {', '.join(r['name'] for r in rows)}", "",
             "Each run is `kathleen-notebook train PRESET [overrides]` (recipes below; the full resolved config is the "
             "run's `config.json`), one CPU thread each, two runs sharing the 2-core machine. Held-out = enwiki test "
             f"split ({n_test:,} bytes), scored exactly by the streaming scorer. This report:", "", "```"]
    lines += [*args.train_command, "python " + shlex.join(sys.argv), "```", "",
              f"| run | memory | parameters | steps | minutes | validation bpb (last) | test bpb, one stream | "
              f"test bpb, windows of {args.window} |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['memory']} | {r['parameters']:,} | {r['steps']:,} | {r['minutes']:.1f} | "
                     f"{r['val']:.4f} | {r['stream']:.4f} | {r['windows']:.4f} |")
    lines += ["", f"Compressors on the whole file: {COMPRESSORS}.", ""]
    for r in rows:
        train = {k: r["train"][k] for k in ("seed", "lr", "batch_size", "min_length", "max_length", "steps",
                                            "warmup_steps", "max_minutes") if k in r["train"]}
        lines.append(f"- `{r['name']}` recipe: {json.dumps(train)}")
    lines += ["", *[f"{note}\n" for note in args.note], f"![curves]({out.name}.png)", ""]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(curves, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.md')}")


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, metrics in curves.items():
        evals = [r for r in metrics if "eval_bpb" in r]
        for axis, x in zip(axes, ("step", "minutes")):
            axis.plot([r[x] for r in evals], [r["eval_bpb"] for r in evals], "o-", label=name)
    for axis, x in zip(axes, ("step", "minutes (wall clock)")):
        axis.set_xlabel(x)
        axis.set_ylabel("validation bits/byte")
        axis.grid(alpha=0.3)
        axis.axhline(2.125, color="gray", linestyle=":", label="xz -9e (in-sample)")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()
