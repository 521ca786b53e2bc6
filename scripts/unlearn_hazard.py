"""Unlearning a fact among facts of one sentence shape: is its question then answered with another fact's value?

    python scripts/unlearn_hazard.py [--model CHECKPOINT] [--length 2048] [--documents 12] [--facts 8] [--seed 0]
        [--out reports/unlearn_hazard]

A repeat bank keys its writes by the last few bytes only (4 in the shipped checkpoint), so facts whose questions
end in the same bytes (" is ") share a key there. Unlearning one fact's sentence subtracts its own writes (the
default); its question can then read the others' values through that key. `NotebookSession.unlearn(...,
clear_shared_keys=True)` also clears from the repeat bank what other positions wrote under the fact's short keys,
which the other facts' questions lose too.

Per document (`fact_recall.unlearning_on_text`): real prose from the enwiki test split with 8 planted held-out
facts, read into a session, every fact asked (greedy), one fact's sentence unlearned, every fact asked again.
Documents of one shape (every fact from the same held-out template, the template turning with the document among
those whose question keeps 4 bytes of the name in the first memory's 16-byte key) and of mixed shapes (the `facts`
command's documents), each unlearned both ways. "borrowed" is the share of unlearned facts whose answer matches
another fact's value on at least half of its bytes. Then the example of reports/repeat_trust.md by hand. Writes
OUT.md and OUT.json, 1 thread.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from modeling_kathleen_notebook.allocator import keep_freed_memory
from modeling_kathleen_notebook.experiments.fact_recall import unlearning_on_text
from modeling_kathleen_notebook.session import DEFAULT_CHECKPOINT, NotebookSession

COLUMNS = ("erased_before", "erased_after", "erased_borrowed_after", "kept_before", "kept_after")
# the example of reports/repeat_trust.md: two facts of one shape, the first unlearned, both asked
EXAMPLE = "The vault code of Marlow is QX7RZ. The vault code of Tessa is BK44P. The weather was mild all week.\n"
ERASED, QUESTIONS = EXAMPLE[:34], ("The vault code of Marlow is", "The vault code of Tessa is")


def example_answers(model, clear_shared_keys: bool | None) -> list[str]:
    """Greedy answers to QUESTIONS after reading EXAMPLE (and unlearning ERASED unless clear_shared_keys is None)."""
    session = NotebookSession(model)
    session.read(EXAMPLE)
    if clear_shared_keys is not None:
        session.unlearn(text=ERASED, clear_shared_keys=clear_shared_keys)
    return [session.ask_text(question, max_new_tokens=7) for question in QUESTIONS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_CHECKPOINT), help="checkpoint folder (default: the shipped)")
    parser.add_argument("--corpus", default="../shared/data/enwiki_excerpt.xml", help="filler text")
    parser.add_argument("--byte-range", type=int, nargs=2, default=[5_480_771, 6_089_746], help="of the corpus")
    parser.add_argument("--length", type=int, default=2048, help="document length in bytes")
    parser.add_argument("--documents", type=int, default=12, help="documents per row")
    parser.add_argument("--facts", type=int, default=8, help="facts per document")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="reports/unlearn_hazard")
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()  # a memory of R = 524,288 allocates large temporaries per call: keep their pages
    if not Path(args.corpus).is_file():
        raise SystemExit(f"unlearn_hazard: --corpus {args.corpus} does not exist")
    filler = Path(args.corpus).read_bytes()[args.byte_range[0]:args.byte_range[1]]
    model = NotebookSession.from_pretrained(args.model).model
    if not model.config.repeat_key_window:
        print(f"note: {args.model} has no repeat bank, so both ways of unlearning are the same")
    example = {way: example_answers(model, clear) for way, clear in
               (("before unlearning", None), ("span only (default)", False), ("clear shared keys", True))}
    print(json.dumps(example))
    rows, started = [], time.perf_counter()
    for one_shape in (True, False):
        for clear in (False, True):
            result = unlearning_on_text(model, filler, args.length, args.documents, args.facts, args.seed,
                                        one_shape=one_shape, clear_shared_keys=clear)
            rows.append({"documents_of": "one shape" if one_shape else "mixed shapes", "clear_shared_keys": clear,
                         **result})
            print(json.dumps(rows[-1]), f"({time.perf_counter() - started:.0f} s)", flush=True)
    command = "python scripts/unlearn_hazard.py " + shlex.join(sys.argv[1:])
    shown = os.path.relpath(args.model) if Path(args.model).exists() else args.model  # no machine paths
    record = {"command": command.strip(), "model": shown, "seed": args.seed, "threads": 1, "rows": rows,
              "example": example}
    Path(args.out + ".json").write_text(json.dumps(record, indent=1))
    lines = [
        "# Unlearning among facts of one sentence shape",
        "",
        f"`{record['command']}`: {shown}, {args.documents} documents of {args.length:,} bytes per row with "
        f"{args.facts} held-out facts each (enwiki test split prose), one fact's sentence unlearned per document, "
        f"greedy answers, seed {args.seed}, 1 thread. Value-byte accuracy before and after unlearning; borrowed: "
        "the share of unlearned facts answered with another fact's value (at least half of its bytes).",
        "",
        "| documents | unlearn | erased before | erased after | borrowed after | kept before | kept after |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        way = "clear shared keys" if row["clear_shared_keys"] else "span only (default)"
        lines.append(f"| {row['documents_of']} | {way} | " + " | ".join(f"{row[c]:.3f}" for c in COLUMNS) + " |")
    lines += ["", f"By hand: {EXAMPLE.strip()!r} read, {ERASED!r} unlearned, greedy answers of 7 bytes:", "",
              "| | " + " | ".join(f"{q!r}" for q in QUESTIONS) + " |", "|---|---|---|"]
    lines += [f"| {way} | " + " | ".join(f"`{a!r}`" for a in answers) + " |" for way, answers in example.items()]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}.md and {args.out}.json")


if __name__ == "__main__":
    main()
