"""What every lab's report shares: its rows (from the runs, or kept from the report when a run folder is gone)
and the hand-written discussion kept beside it."""

from __future__ import annotations

import json
from pathlib import Path


def rows_from_runs(eval_files: dict[str, Path], report: Path) -> dict[str, dict]:
    """Each row's run `eval.json` (`eval_files`: row name -> path), in that order; a row whose run folder is gone
    keeps its entry of `report`.json (arms run at different times, often on different machines, and the run
    folders are not kept). Rows in neither are left out."""
    kept = json.loads(report.with_suffix(".json").read_text()) if report.with_suffix(".json").exists() else {}
    rows = {}
    for name, path in eval_files.items():
        if path.exists():
            rows[name] = json.loads(path.read_text())
        elif name in kept:
            print(f"{name}: no {path}, its row comes from {report.with_suffix('.json')}")
            rows[name] = kept[name]
    return rows


def discussion_lines(report: Path) -> list[str]:
    """The hand-written `<report>_discussion.md` beside a report, as its "Discussion" section (kept across
    regenerations); nothing when there is none."""
    discussion = report.with_name(report.stem + "_discussion.md")
    return ["", "## Discussion", "", discussion.read_text().strip()] if discussion.exists() else []
