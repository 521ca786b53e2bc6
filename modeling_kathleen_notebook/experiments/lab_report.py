"""What every lab script shares: its common options, its rows (from the runs, or kept from the report when a run
folder is gone), a run's training curves, the hand-written discussion kept beside its report, and the three files the
report is written to."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from pathlib import Path


def lab_parser(description: str, defaults: dict) -> argparse.ArgumentParser:
    """--spec, --out, --report, --parallel and --report-only, with the lab's defaults (spec, out, report)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default=defaults["spec"], help="the pre-registered experiment spec")
    parser.add_argument("--out", default=defaults["out"], help="where the runs go")
    parser.add_argument("--report", default=defaults["report"], help="report path without suffix (.md, .png, .json)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (one thread each)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report from the runs' eval.json")
    return parser


def chosen_names(option: str, value: str | None, known: list[str], spec: str) -> list[str]:
    """The comma-separated names `option` gave (all of `known` when it gave none); exits naming those that `spec`
    does not have."""
    names = value.split(",") if value else list(known)
    unknown = set(names) - set(known)
    if unknown:
        raise SystemExit(f"{option}: {sorted(unknown)} are not in {spec}: {sorted(known)}")
    return names


def command_line() -> str:
    """How this script was run, to print in its report (`python scripts/x.py --option ...`)."""
    return "python " + shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def spec_of(command: str) -> str | None:
    """The --spec a recorded command line gave (None: the lab's default spec)."""
    words = shlex.split(command)
    for i, word in enumerate(words):
        if word == "--spec" and i + 1 < len(words):
            return os.path.normpath(words[i + 1])
        if word.startswith("--spec="):
            return os.path.normpath(word.removeprefix("--spec="))
    return None


MADE_BY = "Runs trained and evaluated by: "


def provenance(out: Path, report_only: bool, report: Path | None = None) -> tuple[str, str]:
    """Where a report's numbers come from: every command that trained or evaluated runs into `out` (kept in
    out/commands.txt, this one added when it did) and this one, which writes the report, so a `--report-only` rerun
    still names the commands that made the runs; where out/commands.txt is gone (a new machine), those the earlier
    `report`.md named. Returns the report's line and its figure's caption: the first of those commands that ran
    this report's spec (several specs may share one `out`), else this one."""
    log, command = out / "commands.txt", command_line()
    if not report_only:
        out.mkdir(parents=True, exist_ok=True)
        with log.open("a") as handle:
            handle.write(command + "\n")
    made = log.read_text().splitlines() if log.exists() else commands_named_in(report)
    runs = "; ".join(f"`{line}`" for line in made) if made else f"not recorded in {out}"
    caption = next((line for line in made if spec_of(line) == spec_of(command)), command)
    return f"{MADE_BY}{runs}. Report written by: `{command}`", caption


def commands_named_in(report: Path | None) -> list[str]:
    """The commands that trained the runs, as `report`.md named them (none where it does not exist or names none)."""
    written = report.with_suffix(".md") if report is not None else None
    if written is None or not written.exists():
        return []
    line = next((line for line in written.read_text().splitlines() if MADE_BY in line), "")
    return re.findall(r"`([^`]+)`", line.split(MADE_BY, 1)[-1].split(". Report written by: ")[0])


def training_curves(metrics: list[dict]) -> dict:
    """From a run's metrics.jsonl records: "curve" (step, minutes, train bits per answer byte) at every logged step,
    noisy where lengths are mixed, and "held_out" (step, minutes, eval_bpb) at each evaluation on the fixed
    held-out sequences."""
    return {"curve": [(r["step"], r["minutes"], r["train_bpb"]) for r in metrics],
            "held_out": [(r["step"], r["minutes"], r["eval_bpb"]) for r in metrics if "eval_bpb" in r]}


def read_metrics(path: Path) -> list[dict]:
    """A run's metrics.jsonl records."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def rows_from_runs(eval_files: dict[str, Path], report: Path) -> dict[str, dict]:
    """Each row's run `eval.json` (`eval_files`: row name -> path), in that order; a row whose run folder is gone
    keeps its entry of `report`.json (arms run at different times, often on different machines, and the run
    folders are not kept). Rows in neither are left out; with no row at all it exits with a message."""
    kept = json.loads(report.with_suffix(".json").read_text()) if report.with_suffix(".json").exists() else {}
    rows = {}
    for name, path in eval_files.items():
        if path.exists():
            rows[name] = json.loads(path.read_text())
        elif name in kept:
            print(f"{name}: no {path}, its row comes from {report.with_suffix('.json')}")
            rows[name] = kept[name]
    if not rows:
        raise SystemExit(f"none of {len(eval_files)} runs has an eval.json and {report.with_suffix('.json')} keeps "
                         "none of them: nothing to report")
    return rows


def discussion_lines(report: Path) -> list[str]:
    """The hand-written `<report>_discussion.md` beside a report, as its "Discussion" section (kept across
    regenerations); nothing when there is none."""
    discussion = report.with_name(report.stem + "_discussion.md")
    return ["", "## Discussion", "", discussion.read_text().strip()] if discussion.exists() else []


def save_report(report: Path, lines: list[str], rows: dict, figure, caption: str) -> None:
    """`report`.png from a laid-out matplotlib figure (closed here), `report`.md from `lines` with the picture
    after the title block (its first four lines), `report`.json from `rows`."""
    import matplotlib.pyplot as plt

    figure.savefig(report.with_suffix(".png"), dpi=110)
    plt.close(figure)
    lines.insert(4, f"![{caption}]({report.with_suffix('.png').name})\n")
    report.with_suffix(".md").write_text("\n".join(lines) + "\n")
    report.with_suffix(".json").write_text(json.dumps(rows, indent=1))
