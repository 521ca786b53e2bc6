"""The needle laboratory's report: tables of far-bin recall, every bin and read-out, unlearning, and each of the
spec's pre-registered predictions with its verdict (`hypothesis_lines`); a plot; a summary in another report."""

from __future__ import annotations

import logging
import operator
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .lab_report import discussion_lines
from .needle import LETTERS, VALUE_LENGTH

logger = logging.getLogger(__name__)
BINS = ("near", "mid", "far")


def write_report(spec: dict, setting_name: str, results: dict, report: Path, command: str, spec_path: str) -> None:
    """reports/needle.md and .png from the lab's results; with the spec's "summary_in", also a far-bin
    summary section in that other report (kept there when that report is regenerated)."""
    setting = spec["settings"][setting_name]
    train_length = setting["train"]["max_length"]
    for r in results.values():  # keys are ints in memory, strings after a JSON round trip
        r["recall"] = {int(n): rec for n, rec in r["recall"].items()}
        r["unlearning"] = {int(n): u for n, u in r.get("unlearning", {}).items()}
    lengths = sorted({length for r in results.values() for length in r["recall"]})

    def cell(value):
        return "-" if value is None else f"{value:.3f}"

    lines = [f"# {spec.get('title', 'Needle laboratory (SPEC §6.1)')}", "",
             f"Setting `{setting_name}` of the pre-registered spec `{spec_path}` "
             f"(registered {spec['registered']}). Trained at lengths {setting['train']['min_length']}-{train_length}, "
             f"{setting['train']['steps']} steps of batch {setting['train']['batch_size']}; evaluated on "
             f"{setting['eval']['haystacks']} fresh haystacks per length (1 needle, eval seed {spec['eval_seed']}), "
             f"teacher-forced accuracy on the {VALUE_LENGTH} value bytes; chance is 1/{len(LETTERS)}.", "",
             "Regenerate (trains only what is missing, then evaluates; 1 thread per process):", "", "```",
             command, "```", "", "## Far bin (needle in the first third of the haystack), full logits", "",
             "| arm | seed | params | " + " | ".join(f"{n} ({n // train_length}x)" for n in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    for r in results.values():
        lines.append(f"| {r['arm']} | {r['seed']} | {r['parameters']:,} | " + " | ".join(
            cell(r["recall"][n]["full"]["far"]) if n in r["recall"] else "-" for n in lengths) + " |")
    lines += ["", "## Every bin and read-out (near / mid / far; memory-only and trunk-only logits)", "",
              "| arm | seed | length | full | memory only | trunk only | haystacks per bin |",
              "|---|---|---|---|---|---|---|"]
    for r in results.values():
        for n in lengths:
            if n in r["recall"]:
                rec = r["recall"][n]
                fmt = lambda d: " / ".join(cell(d[b]) for b in BINS)  # noqa: E731
                lines.append(f"| {r['arm']} | {r['seed']} | {n} | {fmt(rec['full'])} | {fmt(rec['memory'])} | "
                             f"{fmt(rec['trunk'])} | {'/'.join(str(rec['counts'][b]) for b in BINS)} |")
    if any(r.get("unlearning") for r in results.values()):
        lines += ["", "## Unlearning and attribution (5 facts, one erased, full-model recall)", "",
                  "| arm | seed | length | erased | retained | provenance | recalled bytes |",
                  "|---|---|---|---|---|---|---|"]
    for r in results.values():
        for n, u in r.get("unlearning", {}).items():
            lines.append(f"| {r['arm']} | {r['seed']} | {n} | {cell(u['erased'])} | {cell(u['retained'])} | "
                         f"{cell(u['provenance'])} | {u['recalled_bytes']} |")
    curves = {name: r for name, r in results.items() if r.get("held_out")}
    if curves:
        lines += ["", "## Training: held-out loss", "",
                  "The training command's evaluations (metrics.jsonl): bits per byte of what the loss is on (the "
                  "answers, where the setting's task says so) on fixed held-out haystacks, at step (minutes).", ""]
        lines += [f"- {r['arm']}, seed {r['seed']}, {r['steps']:,} steps: " + ", ".join(
            f"{bpb:.3f} at {step:,} ({minutes:.0f})" for step, minutes, bpb in r["held_out"]) for r in curves.values()]
    lines += ["", "## Hypotheses and targets (from the spec)", ""]
    lines += hypothesis_lines(results, train_length, setting_predictions(spec, setting_name))
    lines += discussion_lines(report)
    report.parent.mkdir(parents=True, exist_ok=True)
    kept = summary_sections(report.read_text()) if report.exists() else []
    report.write_text("\n".join(lines + ([""] + kept if kept else [])) + "\n")
    if "summary_in" in spec:
        target = Path(spec["summary_in"])
        link = os.path.relpath(report, target.parent)
        insert_summary(target, report, summary_lines(spec, setting_name, results, train_length, link, command))
    plot(results, lengths, train_length, report.with_suffix(".png"))
    logger.info("wrote %s and %s", report, report.with_suffix(".png"))


SUMMARY_BEGIN, SUMMARY_END = "<!-- summary of {} -->", "<!-- end of summary of {} -->"


def summary_lines(spec: dict, setting_name: str, results: dict, train_length: int, link: str,
                  command: str) -> list[str]:
    """A far-bin table of this lab (one row per arm and seed) for another report."""
    lengths = sorted({int(n) for r in results.values() for n in r["recall"]})
    lines = ["", f"## {spec['summary_title']}", "",
             f"From [{Path(link).name}]({link}) (setting `{setting_name}`, `{command}`): far-bin value-byte "
             "accuracy, full logits.", "",
             "| arm | seed | params | " + " | ".join(f"{n} ({n // train_length}x)" for n in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    for r in results.values():
        lines.append(f"| {r['arm']} | {r['seed']} | {r['parameters']:,} | " + " | ".join(
            "-" if far_at(r, n) is None else f"{far_at(r, n):.3f}" for n in lengths) + " |")
    return lines


def summary_sections(text: str) -> list[str]:
    """The summary sections other labs inserted into a report, to keep when it is rewritten."""
    kept, inside = [], False
    for line in text.splitlines():
        inside = inside or (line.startswith("<!-- summary of ") and not line.startswith("<!-- end"))
        if inside:
            kept.append(line)
        inside = inside and not line.startswith("<!-- end of summary of ")
    return kept


def insert_summary(target: Path, source: Path, lines: list[str]) -> None:
    """Replace (or append) the summary of `source` in `target`."""
    begin, end = SUMMARY_BEGIN.format(source.name), SUMMARY_END.format(source.name)
    text = target.read_text() if target.exists() else ""
    block = "\n".join([begin, *lines, end])
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    target.write_text(text)
    logger.info("updated the summary of %s in %s", source, target)


def far_at(result: dict, length: int) -> float | None:
    """Far-bin full-logit accuracy at a length (keys are ints in memory, strings after JSON)."""
    recall = result["recall"].get(length, result["recall"].get(str(length)))
    return None if recall is None else recall["full"]["far"]


@dataclass(frozen=True)
class Prediction:
    """One of a spec's pre-registered "predictions", such as ">= 0.90": a comparison with a bound."""

    op: str
    bound: float

    @classmethod
    def parse(cls, text: str) -> Prediction:
        op, bound = text.split()
        if op not in COMPARISONS:
            raise ValueError(f"a prediction is one of {sorted(COMPARISONS)} and a number, got {text!r}")
        return cls(op, float(bound))

    def verdict(self, value: float) -> str:
        """"held", or "failed by" the distance to the bound (a mean of fp32 byte fractions equal to the bound but for
        rounding, such as 0.10000000298 against <= 0.10, counts as equal)."""
        if COMPARISONS[self.op](round(value, 6), self.bound):
            return "held"
        return f"failed by {abs(value - self.bound):.3f}"

    def __str__(self) -> str:
        return f"{self.op} {self.bound:g}"


COMPARISONS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def setting_predictions(spec: dict, setting_name: str) -> dict[str, str]:
    """The spec's "predictions", with those a setting registered for itself (an amendment's) added or replacing."""
    return {**spec.get("predictions", {}), **spec["settings"][setting_name].get("predictions", {})}


def hypothesis_lines(results: dict, train_length: int, predictions: dict[str, str]) -> list[str]:
    """Each of the spec's predictions that these results can test, with the measured values and its verdict."""
    predicted = {name: Prediction.parse(text) for name, text in predictions.items()}
    lines = []

    def line(label: str, name: str, shown: str, value: float) -> None:
        if name in predicted:
            lines.append(f"- {label}: {shown} (predicted {predicted[name]}: {predicted[name].verdict(value)})")

    for r in results.values():
        arm, seed = r["arm"], r["seed"]
        far = {int(n): far_at(r, n) for n in r["recall"] if far_at(r, n) is not None}
        if not far:
            continue
        four, sixteen = far.get(4 * train_length), far.get(16 * train_length)
        if arm == "notebook-learned" and four is not None:
            line(f"H1 learned gate, seed {seed}", "learned_far_4x", f"far bin at 4x = {four:.3f}", four)
            if sixteen is not None:
                line(f"H1 learned gate, seed {seed}", "learned_far_16x_drop", f"4x -> 16x drop = {four - sixteen:+.3f}",
                     four - sixteen)
        if arm == "notebook-oracle":
            spread = max(far.values()) - min(far.values())
            line(f"H2 oracle gate, seed {seed}", "oracle_flatness", f"far bin {min(far.values()):.3f}-"
                 f"{max(far.values()):.3f} over {min(far)}-{max(far)} bytes, spread {spread:.3f}", spread)
        if arm == "trunk":
            line(f"H3 bare trunk, seed {seed}", "trunk_far", f"far bin at most {max(far.values()):.3f}",
                 max(far.values()))
        if arm == "attention" and train_length in far:
            shown = " / ".join(f"{far[n]:.3f}" for n in sorted(far)) + " at " + " / ".join(map(str, sorted(far)))
            line(f"H4 attention head, seed {seed}", "attention_512", f"far bin {far[train_length]:.3f} at the "
                 f"training length; {shown}", far[train_length])
        for times in (1, 4, 8, 16, 32, 64):  # per-arm predictions, "<arm>_far_<times>x"
            if times * train_length in far:
                line(f"{arm}, seed {seed}", f"{arm}_far_{times}x", f"far bin {far[times * train_length]:.3f} at "
                     f"{times}x", far[times * train_length])
        for n, u in r.get("unlearning", {}).items():
            for name in ("erased", "retained", "provenance"):
                if u[name] is not None:
                    line(f"H5 {arm}, seed {seed}, {n} bytes", name, f"{name} {u[name]:.3f}", u[name])
        check_adapter_predictions(r, far, train_length, line)
    check_period_predictions(results, line)
    return lines or ["- no arm in these results tests the spec's predictions"]


def check_adapter_predictions(r: dict, far: dict, train_length: int, line: Callable) -> None:
    """A1-A3 of needle_adapter.json, through `line`: notebook arms at 1x/4x/8x; bare Mamba beyond 1x; a bare
    transformer's drop beyond 1x."""
    values = [far.get(k * train_length) for k in (1, 4, 8)]
    if None in values:
        return
    shown = " / ".join(f"{f:.3f}" for f in values) + " at 1x / 4x / 8x"
    if r["arm"].endswith("+notebook"):
        line(f"A1 {r['arm']}, seed {r['seed']}", "notebook_far_1x_4x_8x", f"far bin {shown}", min(values))
    elif r["arm"] == "mamba":
        line(f"A2 {r['arm']}, seed {r['seed']}", "mamba_far_4x_8x", f"far bin {shown}", max(values[1:]))
    elif r["arm"] == "llama":
        line(f"A3 {r['arm']}, seed {r['seed']}", "llama_far_drop_beyond_1x", f"far bin {shown}",
             values[0] - max(values[1:]))


def check_period_predictions(results: dict, line: Callable) -> None:
    """P1 of needle_period.json, through `line`: per seed, the learned notebook's far bin against the period-259
    arm's."""
    for control in (r for r in results.values() if r["arm"] == "notebook-learned-period-259"):
        for r in (r for r in results.values() if r["arm"] == "notebook-learned" and r["seed"] == control["seed"]):
            lengths = sorted(int(n) for n in r["recall"] if far_at(r, n) is not None and far_at(control, n) is not None)
            gaps = [far_at(r, n) - far_at(control, n) for n in lengths]
            line(f"P1 seed {r['seed']}", "period_far_difference", "far bin minus the period-259 arm's "
                 f"{' / '.join(f'{g:+.3f}' for g in gaps)} at {' / '.join(map(str, lengths))}",
                 max(abs(g) for g in gaps))


def plot(results: dict, lengths: list[int], train_length: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {name: r["held_out"] for name, r in results.items() if r.get("held_out")}
    figure, axes = plt.subplots(1, 2 if curves else 1, figsize=(12 if curves else 7, 4.2), squeeze=False)
    axis = axes[0, 0]
    for name, r in results.items():
        xs = [n for n in lengths if n in r["recall"]]
        axis.plot(xs, [r["recall"][n]["full"]["far"] for n in xs], "o-", label=name)
    axis.axvline(train_length, color="gray", linestyle=":", label="training length")
    axis.axhline(1 / len(LETTERS), color="gray", linestyle="--", linewidth=0.8, label="chance")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("haystack length (bytes)")
    axis.set_ylabel("far-bin value-byte accuracy")
    axis.set_ylim(-0.02, 1.02)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    if curves:
        held_out = axes[0, 1]
        for name, curve in curves.items():
            held_out.plot([c[0] for c in curve], [c[2] for c in curve], "o-", label=name)
        held_out.set_xlabel("training step")
        held_out.set_ylabel("held-out bits per trained-on byte")
        held_out.set_title("training (metrics.jsonl)", fontsize=9)
        held_out.grid(alpha=0.3)
        held_out.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
