"""Which repeats and which facts could an exact-match key recall at all? A property of the text and the key
window, no model.

    python scripts/key_reach.py [--file ../shared/data/enwiki_excerpt.xml] [--byte-range 5480771 6089746]
        [--window 4096] [--key-windows 4 7 16] [--fact-lengths 2048 16384] [--documents 8] [--seed 0]
        [--out reports/key_reach]

Repeats: the repeat probe's classes (SPEC §6.2: bytes of first mentions and of repeated words, by distance back) in
windows of `window` bytes, each from an empty memory as the probe scores them (exact_context_reach). Facts: the
documents of `kathleen-notebook facts` (held-out phrasings, 8 facts each, the same seeds), each fact asked after
its document; a value byte's key is the W bytes before it in query + value. For each key window W and each class:
stored, the share of its bytes whose W preceding bytes occurred earlier followed by the same byte (a bound key,
which matches only its exact context, has the byte in memory if it was written); clean, stored and never followed
by another byte (the read names this byte alone); wrong, followed before only by other bytes (a clean read names a
wrong byte). Writes OUT.md and OUT.json with the command line.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
from pathlib import Path

import torch

from modeling_kathleen_notebook.experiments.fact_recall import make_fact_document
from modeling_kathleen_notebook.experiments.repeat_probe import (
    DISTANCE_BINS,
    FIRST,
    REPEAT,
    classify_bytes,
    exact_context_reach,
)


def shares(stored, rivals) -> dict:
    """stored / clean / wrong shares of bytes (bool tensors of one class's bytes)."""
    if not len(stored):
        return {"bytes": 0, "stored": None, "clean": None, "wrong": None}
    return {"bytes": len(stored), "stored": stored.float().mean().item(),
            "clean": (stored & ~rivals).float().mean().item(), "wrong": (rivals & ~stored).float().mean().item()}


def reach_table(data: bytes, window: int, key_windows: list[int]) -> dict:
    """key window -> class -> shares (`shares`) of the repeat probe's classes."""
    kind, distance = classify_bytes(data, window)
    classes = {"first mentions": kind == FIRST, "repeats": kind == REPEAT}
    for lo, hi in DISTANCE_BINS:
        classes[f"repeats {lo:,}-{f'{hi:,}' if hi else ''}"] = (kind == REPEAT) & (distance >= lo) & (
            distance < (hi or len(data) + 1))
    table = {}
    for key_window in key_windows:
        stored, rivals = exact_context_reach(data, window, key_window)
        table[str(key_window)] = {name: shares(stored[mask], rivals[mask]) for name, mask in classes.items()}
    return table


def fact_table(filler: bytes, lengths: list[int], documents: int, key_windows: list[int], seed: int) -> dict:
    """key window -> "facts at L bytes" -> shares over the value bytes of the facts asked after their document
    (document d of length L drawn as `kathleen-notebook facts` draws it)."""
    table = {str(w): {} for w in key_windows}
    for length in lengths:
        found = {w: ([], [], []) for w in key_windows}  # stored, rivals, first byte of its value
        for d in range(documents):
            document = make_fact_document(filler, length, 8, random.Random(seed * 1_000_003 + length * 1_009 + d))
            for key_window in key_windows:
                followers: dict[bytes, set[int]] = {}
                for i in range(key_window, len(document.text)):
                    followers.setdefault(document.text[i - key_window:i], set()).add(document.text[i])
                for fact in document.facts:
                    asked, start = (fact.query + fact.value).encode(), len(fact.query.encode())
                    for j in range(start, len(asked)):
                        seen = followers.get(asked[j - key_window:j], set())
                        for column, value in zip(found[key_window], (asked[j] in seen, bool(seen - {asked[j]}),
                                                                     j == start)):
                            column.append(value)
        for key_window, columns in found.items():
            stored, rivals, first = (torch.tensor(column, dtype=torch.bool) for column in columns)
            table[str(key_window)][f"fact values at {length:,} bytes"] = shares(stored, rivals)
            table[str(key_window)][f"their first bytes at {length:,}"] = shares(stored[first], rivals[first])
    return table


def markdown(table: dict) -> list[str]:
    names = list(next(iter(table.values())))
    first = next(iter(table.values()))
    lines = ["| key window | " + " | ".join(f"{name} ({first[name]['bytes']:,} bytes)" for name in names) + " |",
             "|---|" + "---|" * len(names)]
    for key_window, row in table.items():
        cells = ["-" if row[name]["stored"] is None else
                 f"{row[name]['stored']:.3f} / {row[name]['clean']:.3f} / {row[name]['wrong']:.3f}" for name in names]
        lines.append(f"| {key_window} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", default="../shared/data/enwiki_excerpt.xml")
    parser.add_argument("--byte-range", type=int, nargs=2, default=[5_480_771, 6_089_746])
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--key-windows", type=int, nargs="+", default=[4, 7, 16])
    parser.add_argument("--fact-lengths", type=int, nargs="*", default=[2048, 16384],
                        help="fact document lengths (none: no facts table)")
    parser.add_argument("--documents", type=int, default=8, help="fact documents per length")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fact documents (as `kathleen-notebook facts`)")
    parser.add_argument("--out", default="reports/key_reach")
    args = parser.parse_args()
    path = Path(args.file)
    if not path.is_file():
        raise SystemExit(f"no file {path}")
    start, end = args.byte_range
    data = path.read_bytes()[start:end]
    if not data or args.window < 2 or min(args.key_windows) < 1 or args.documents < 1:
        raise SystemExit(f"nothing to measure: {len(data)} bytes in --byte-range {start} {end}, --window "
                         f"{args.window}, --key-windows {args.key_windows}, --documents {args.documents} (need "
                         "bytes, a window >= 2, key windows >= 1, a document)")
    command = shlex.join(["python", "scripts/key_reach.py", *sys.argv[1:]])
    repeats = reach_table(data, args.window, args.key_windows)
    lines = ["# Which repeats and facts could an exact-match key recall?", "", f"`{command}`: {len(data):,} bytes of "
             f"{path.name} [{start:,}, {end:,}).", "",
             "Each cell: stored / clean / wrong, shares of the class's bytes. stored: the key window of preceding "
             "bytes occurred earlier followed by the same byte; clean: stored, and never followed by another byte; "
             "wrong: followed before only by other bytes.", "",
             f"## Repeats: the repeat probe's classes, windows of {args.window:,} bytes from an empty memory", "",
             *markdown(repeats)]
    facts = fact_table(data, args.fact_lengths, args.documents, args.key_windows, args.seed) if args.fact_lengths \
        else {}
    if facts:
        lines += ["", f"## Facts: the value bytes of `kathleen-notebook facts`' questions ({args.documents} documents "
                  f"per length, 8 facts each, held-out phrasings, seed {args.seed}), each asked after its document",
                  "", *markdown(facts)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"command": command, "repeats": repeats, "facts": facts}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
