"""Which repeats could an exact-match key recall at all? A property of the text and the key window, no model.

    python scripts/key_reach.py [--file ../shared/data/enwiki_excerpt.xml] [--byte-range 5480771 6089746]
        [--window 4096] [--key-windows 4 7 16] [--out reports/key_reach]

The repeat probe's classes (SPEC §6.2: bytes of first mentions and of repeated words, by distance back) in
windows of `window` bytes, each from an empty memory as the probe scores them. For each key window W, the share of
a class's bytes whose W preceding bytes occurred earlier in the window followed by the same byte (exact_context_reach:
a bound key, which matches only its exact context, has the byte in memory if it was written) and followed only by
other bytes (a clean read names a wrong byte). Writes OUT.md and OUT.json with the command line.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from modeling_kathleen_notebook.experiments.repeat_probe import (
    DISTANCE_BINS,
    FIRST,
    REPEAT,
    classify_bytes,
    exact_context_reach,
)


def reach_table(data: bytes, window: int, key_windows: list[int]) -> dict:
    """key window -> class -> {"bytes", "stored", "other"} (shares of the class's bytes)."""
    kind, distance = classify_bytes(data, window)
    classes = {"first mentions": kind == FIRST, "repeats": kind == REPEAT}
    for lo, hi in DISTANCE_BINS:
        classes[f"repeats {lo:,}-{f'{hi:,}' if hi else ''}"] = (kind == REPEAT) & (distance >= lo) & (
            distance < (hi or len(data) + 1))
    table = {}
    for key_window in key_windows:
        stored, other = exact_context_reach(data, window, key_window)
        table[str(key_window)] = {name: {"bytes": int(mask.sum()),
                                         "stored": stored[mask].float().mean().item() if mask.any() else None,
                                         "other": other[mask].float().mean().item() if mask.any() else None}
                                  for name, mask in classes.items()}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", default="../shared/data/enwiki_excerpt.xml")
    parser.add_argument("--byte-range", type=int, nargs=2, default=[5_480_771, 6_089_746])
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--key-windows", type=int, nargs="+", default=[4, 7, 16])
    parser.add_argument("--out", default="reports/key_reach")
    args = parser.parse_args()
    path = Path(args.file)
    if not path.is_file():
        raise SystemExit(f"no file {path}")
    start, end = args.byte_range
    data = path.read_bytes()[start:end]
    if not data or args.window < 2 or min(args.key_windows) < 1:
        raise SystemExit(f"nothing to measure: {len(data)} bytes in --byte-range {start} {end}, --window "
                         f"{args.window}, --key-windows {args.key_windows} (need bytes, a window >= 2, windows >= 1)")
    table = reach_table(data, args.window, args.key_windows)
    command = shlex.join(["python", "scripts/key_reach.py", *sys.argv[1:]])
    names = list(next(iter(table.values())))
    lines = ["# Which repeats could an exact-match key recall?", "", f"`{command}`: {len(data):,} bytes of "
             f"{path.name} [{start:,}, {end:,}), windows of {args.window:,} bytes, each from an empty memory.", "",
             "stored: share of the class's bytes whose key window of preceding bytes occurred earlier in the window "
             "followed by the same byte; other: the context occurred earlier, followed only by other bytes.", "",
             "| key window | " + " | ".join(f"{name} ({table[str(args.key_windows[0])][name]['bytes']:,} bytes): "
                                            "stored / other" for name in names) + " |",
             "|---|" + "---|" * len(names)]
    for key_window, row in table.items():
        lines.append(f"| {key_window} | " + " | ".join(
            "-" if row[name]["stored"] is None else f"{row[name]['stored']:.3f} / {row[name]['other']:.3f}"
            for name in names) + " |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"command": command, "table": table}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
