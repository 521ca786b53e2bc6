"""MQAR on bytes at matched recurrent state (issue 19): train every arm of the pre-registered spec on the task, then
measure recall against the number of pairs K (capacity), against sequence length, and with keys reassigned later,
beside each arm's state bytes per sequence; write reports/mqar.{md,png,json}.

    python scripts/mqar_lab.py [--spec configuration/experiments/mqar.json] [--out runs/mqar] [--arms a,b]
        [--parallel 2] [--budget-scale 5]
    python scripts/mqar_lab.py --report-only
    python scripts/mqar_lab.py --train-only   # e.g. on a GPU machine; evaluate later (where the runs are) without it

Each arm trains as a `kathleen-notebook train` process (needle_lab.train_arms) for the spec's wall-clock budget on
one thread (times --budget-scale, into its own folder: an arm that did not learn gets five times the budget),
on MQAR sequences with the loss on the asked values only (data.mqar, Zoology's signal); a finished run is not
trained again, an interrupted one resumes from its newest checkpoint. Evaluation runs here, one thread:
teacher-forced value-byte accuracy on fresh sequences drawn from the spec's eval seed, the same sequences for every
arm. For notebook arms the reassigned variant is also measured after an explicit update: a `NotebookSession` reads
everything before the queries with the model's own write rule, unlearns the overridden pairs, then answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from modeling_kathleen_notebook.experiments.lab_report import (
    chosen_names,
    discussion_lines,
    lab_parser,
    provenance,
    read_metrics,
    rows_from_runs,
    save_report,
    training_curves,
)
from modeling_kathleen_notebook.experiments.mqar import MQARExample, eval_sequences, pairs_that_fit, state_bytes
from modeling_kathleen_notebook.experiments.needle_lab import train_arms
from modeling_kathleen_notebook.training.config import MQARSpec

DEFAULTS = {"spec": "configuration/experiments/mqar.json", "out": "runs/mqar", "report": "reports/mqar"}


def per_arm(spec: dict, section: str, arm: str) -> dict:
    """The spec's `section` (train or task) for one arm: with the arm's own settings from <section>_per_arm."""
    return {**spec[section], **spec.get(f"{section}_per_arm", {}).get(arm, {})}


def arm_config(spec: dict, arm: str, out: Path, budget_scale: float) -> dict:
    """The `kathleen-notebook train` config of one arm: the spec's train settings and task, each with the arm's own
    (train_per_arm, task_per_arm) where the spec has them."""
    train = {**per_arm(spec, "train", arm), "max_minutes": spec["train"]["max_minutes"] * budget_scale}
    task = per_arm(spec, "task", arm)
    return {"model": spec["arms"][arm], "data": {"train": {"mqar": task}, "eval": {"mqar": task}},
            "train": train, "output_dir": str(out / arm)}


@torch.no_grad()
def recall(model, examples: list[MQARExample], stale: bool = False) -> float:
    """Mean teacher-forced accuracy on the asked values (on the overridden values with `stale`)."""
    scores = []
    for example in examples:
        logits = model(example.input_ids[None], use_cache=False).logits[0]
        scores.append(example.value_accuracy(logits, example.stale if stale else None))
    return sum(scores) / len(scores)


@torch.no_grad()
def recall_after_update(model, examples: list[MQARExample]) -> float:
    """Accuracy on the latest values after a `NotebookSession` read the pairs with the model's own write rule and
    unlearned the overridden ones (an explicit update)."""
    from modeling_kathleen_notebook.session import NotebookSession

    scores = []
    for example in examples:
        queries = example.first_query
        session = NotebookSession(model)
        session.read(example.input_ids[:queries], segments=example.pair_spans, progress=False)
        for span in example.stale_spans:
            session.unlearn(span=span)
        out = model(example.input_ids[None, queries:], cache=session.cache, use_cache=True)
        logits = torch.zeros(len(example.input_ids), out.logits.shape[-1])
        logits[queries:] = out.logits[0]
        scores.append(example.value_accuracy(logits))
    return sum(scores) / len(scores)


def evaluate_run(spec: dict, arm: str, folder: Path) -> dict:
    """Capacity, length and reassigned-key recall of one trained arm (on keys of its task's length), its state
    bytes and training curves."""
    from transformers import AutoModelForCausalLM

    import modeling_kathleen_notebook  # noqa: F401  registers the Auto classes

    torch.set_num_threads(1)
    ev, seed = spec["eval"], spec["eval"]["seed"]
    model = AutoModelForCausalLM.from_pretrained(folder / "final").eval()
    metrics = read_metrics(folder / "metrics.jsonl")
    result = {"parameters": sum(p.numel() for p in model.parameters()), "steps": metrics[-1]["step"],
              "train_minutes": metrics[-1]["minutes"], **training_curves(metrics)}
    length, key_length = ev["capacity_length"], MQARSpec(**per_arm(spec, "task", arm)).key_length
    result["key_length"] = key_length
    with torch.no_grad():
        result["state_bytes"] = state_bytes(
            model(eval_sequences(length, 1, 1, seed, key_length=key_length)[0].input_ids[None]).cache)
    result["capacity"] = {str(k): recall(model, eval_sequences(length, k, ev["examples"], seed, key_length=key_length))
                          for k in ev["pairs"] if k <= pairs_that_fit(length, key_length=key_length)}
    print(folder.name, "capacity", result["capacity"], flush=True)
    result["length"] = {str(n): recall(model, eval_sequences(n, ev["length_pairs"], ev["examples"], seed,
                                                             key_length=key_length))
                        for n in ev["lengths"]}
    print(folder.name, "length", result["length"], flush=True)
    shape = ev["reassigned"]
    changed = eval_sequences(shape["length"], shape["pairs"], ev["examples"], seed, shape["reassigned"], key_length)
    result["reassigned"] = {"latest": recall(model, changed), "stale": recall(model, changed, stale=True)}
    if getattr(model.config, "memory", None) == "notebook":
        result["reassigned"]["latest_after_update"] = recall_after_update(model, changed)
    print(folder.name, "reassigned", result["reassigned"], flush=True)
    (folder / "eval.json").write_text(json.dumps(result, indent=1))
    return result


def largest_k(capacity: dict, level: float) -> int | None:
    """The largest K whose recall (and every smaller K's) is at least `level`."""
    best = None
    for k, value in sorted(capacity.items(), key=lambda item: int(item[0])):
        if value < level:
            break
        best = int(k)
    return best


def write_report(spec: dict, spec_path: str, rows: dict, report: Path, made_by: tuple[str, str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = spec["eval"]
    pairs = [str(k) for k in ev["pairs"] if any(str(k) in row["capacity"] for row in rows.values())]
    lines = [f"# {spec['title']}", "", f"Pre-registered spec: `{spec_path}` (registered "
             f"{spec['registered']}). {made_by[0]}.", "", f"Question: {spec['question']}", "",
             f"Teacher-forced value-byte accuracy, {ev['examples']} sequences per point, eval seed {ev['seed']}, the "
             "same sequences for every arm; state bytes: what one sequence's cache holds after reading "
             f"{ev['capacity_length']:,} bytes (a transformer's KV cache grows with length).", "",
             f"## Capacity: recall against K at {ev['capacity_length']:,} bytes", "",
             "| arm | parameters | state bytes | steps (minutes) | " + " | ".join(pairs) + " | K at >= 0.90 |",
             "|---|---|---|---|" + "---|" * len(pairs) + "---|"]
    for name, row in rows.items():
        cells = " | ".join(f"{row['capacity'][k]:.3f}" if k in row["capacity"] else "-" for k in pairs)
        lines.append(f"| {name} | {row['parameters']:,} | {row['state_bytes']:,} | {row['steps']:,} "
                     f"({row['train_minutes']:.0f}) | {cells} | {largest_k(row['capacity'], 0.9) or '-'} |")
    lengths = [str(n) for n in ev["lengths"]]
    lines += ["", f"## Length: recall against sequence length at K = {ev['length_pairs']}", "",
              "| arm | " + " | ".join(f"{int(n):,}" for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
    lines += [f"| {name} | " + " | ".join(f"{row['length'][n]:.3f}" for n in lengths) + " |"
              for name, row in rows.items()]
    shape = ev["reassigned"]
    lines += ["", f"## Keys reassigned later ({shape['pairs']} pairs, {shape['reassigned']} written again with new "
              f"values, {shape['length']:,} bytes)", "", "| arm | latest value | overridden value | latest after an "
              "explicit update |", "|---|---|---|---|"]
    for name, row in rows.items():
        r = row["reassigned"]
        update = f"{r['latest_after_update']:.3f}" if "latest_after_update" in r else "-"
        lines.append(f"| {name} | {r['latest']:.3f} | {r['stale']:.3f} | {update} |")
    lines += ["", "## Hypotheses (as registered)", "", *[f"- {h}" for h in spec["hypotheses"]]]
    lines += discussion_lines(report)

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.8))
    for name, row in rows.items():
        label = f"{name} ({row['state_bytes']:,} B)"
        left.plot([int(k) for k in row["capacity"]], list(row["capacity"].values()), "o-", label=label)
        middle.plot([int(n) for n in row["length"]], list(row["length"].values()), "o-", label=label)
        line, = right.plot([c[1] for c in row["curve"]], [c[2] for c in row["curve"]], alpha=0.25, linewidth=0.8)
        held_out = row.get("held_out", [])  # rows evaluated before it was recorded have none
        right.plot([c[1] for c in held_out], [c[2] for c in held_out], "o-", color=line.get_color(), label=label)
    for axis, xlabel in ((left, "pairs K"), (middle, "sequence length (bytes)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel(xlabel)
        axis.set_ylabel("value-byte recall")
        axis.set_ylim(0, 1.02)
        axis.grid(alpha=0.3)
    right.set_xlabel("training minutes")
    right.set_ylabel("bits per answer byte (faint: training steps; dots: held-out)")
    right.grid(alpha=0.3)
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    figure.suptitle(f"MQAR on bytes ({made_by[1]})", fontsize=8)
    figure.tight_layout()
    save_report(report, lines, rows, figure, "recall against K and length, training curves")


def main() -> None:
    parser = lab_parser(__doc__, DEFAULTS)
    parser.add_argument("--arms", help="comma-separated arms (default: all of the spec)")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="train for this many times the spec's minutes (runs go to OUT/budget<scale>x)")
    parser.add_argument("--train-only", action="store_true",
                        help="train the arms, then stop (no evaluation, no report)")
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    arms = chosen_names("--arms", args.arms, list(spec["arms"]), args.spec)
    out = Path(args.out) / (f"budget{args.budget_scale:g}x" if args.budget_scale != 1 else "")
    made_by = provenance(out, args.report_only, Path(args.report))  # before training: a --train-only run counts
    if not args.report_only:
        out.mkdir(parents=True, exist_ok=True)
        train_arms([arm_config(spec, arm, out, args.budget_scale) for arm in arms], out, args.parallel)
        if args.train_only:
            print(f"trained {', '.join(arms)} in {out}")
            return
        for arm in arms:
            if not (out / arm / "eval.json").exists():
                evaluate_run(spec, arm, out / arm)
    report = Path(args.report)
    rows = rows_from_runs({arm: out / arm / "eval.json" for arm in spec["arms"]}, report)
    report.parent.mkdir(parents=True, exist_ok=True)
    write_report(spec, args.spec, rows, report, made_by)
    print(f"wrote {report}.md, .png, .json")


if __name__ == "__main__":
    main()
