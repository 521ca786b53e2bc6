"""Measure a checkpoint for its model card: test bits/byte, held-out fact recall by length, unlearning on text,
the repeat probe against a bare trunk, needle recall.

    python scripts/measure_checkpoint.py CHECKPOINT [--data ../shared/data/enwiki_excerpt.xml] \
        [--documents 8] [--facts 8] [--seed 0] [--trunk runs/facts/trunk-s42/final] [--out CHECKPOINT/measurements.json]
    python scripts/measure_checkpoint.py CHECKPOINT --trunk-only --trunk TRUNK [--bpb-bytes N]
    python scripts/measure_checkpoint.py CHECKPOINT --facts-from FACTS.json [--skip windows unlearning needle] ...

--facts-from takes the fact recall from a `kathleen-notebook facts` run of the same checkpoint on the test split
(held-out facts, the same --documents, --facts and --seed, every length below) instead of measuring it again:
the slowest part at a large R.

--trunk-only adds the trunk's bits/byte and the repeat probe to the measurements file (creating it if absent; a
trunk trained later, or the comparison run beside the rest in a second process). A run without --trunk keeps the
trunk comparison already in its file.

Test split = enwiki bytes [5,480,771, 6,089,746) (shared data README). Fact documents use test-split text as
filler and facts.py's held-out part (phrasings, names and value alphabets never trained on). 1 thread unless
--threads; greedy decoding; seeds stated in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

import torch

from modeling_kathleen_notebook.allocator import keep_freed_memory
from modeling_kathleen_notebook.experiments.fact_recall import evaluate_fact_recall, format_table, unlearning_on_text
from modeling_kathleen_notebook.experiments.needle_lab import recall_by_distance
from modeling_kathleen_notebook.experiments.repeat_probe import probe_against_trunk
from modeling_kathleen_notebook.scoring import bits_per_byte
from modeling_kathleen_notebook.session import NotebookSession
from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

TEST_SPLIT = (5_480_771, 6_089_746)
LENGTHS = (512, 2048, 8192, 16384)
SKIPPABLE = ("windows", "unlearning", "needle")
TRUNK_KEYS = ("trunk_test_bpb", "trunk_test_bpb_2048", "repeat_probe", "trunk_checkpoint", "trunk_command")


def compare_with_trunk(model, trunk_path: str, scored: bytes, repeat_probe: bool = True, batch_size: int = 16,
                       lengths: tuple[int, ...] = (2048, 4096)) -> dict:
    """The bare trunk's test bits/byte and (unless repeat_probe is False) the repeat probe of `model` against it."""
    from transformers import AutoModelForCausalLM

    trunk = AutoModelForCausalLM.from_pretrained(trunk_path).eval()
    with torch.no_grad():
        results = {"trunk_test_bpb": bits_per_byte(trunk, bytes_to_ids(scored), progress="trunk, stream"),
                   "trunk_test_bpb_2048": bits_per_byte(trunk, bytes_to_ids(scored), window=2048,
                                                        progress="trunk, windows")}
        if repeat_probe:
            results["repeat_probe"] = probe_against_trunk(model, trunk, scored, list(lengths), batch_size)
            print("repeat probe:", json.dumps(results["repeat_probe"], indent=1))
    return {**results, "trunk_checkpoint": trunk_path}


def facts_from(path: str, checkpoint: str, data: str, documents: int, facts: int, seed: int) -> tuple[dict, str]:
    """The fact recall of a `kathleen-notebook facts` record, {length: summary}, and the command that measured it,
    after checking that it measured what this script would: the same checkpoint, the test split of `data`,
    held-out facts, documents, facts, seed."""
    try:
        record = json.loads(Path(path).read_text())
        results = {int(length): summary for length, summary in record["results"].items()}
        corpus, _, span = record["corpus"].partition(":")
        found = {"model": record["model"], "corpus": f"{corpus}:{span}", "split": record["split"],
                 "documents": record["documents"], "facts_per_document": record["facts_per_document"],
                 "seed": record["seed"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise SystemExit(f"--facts-from {path}: not a `kathleen-notebook facts` record ({error})") from None
    wanted = {"model": checkpoint, "corpus": f"{data}:{TEST_SPLIT[0]}:{TEST_SPLIT[1]}", "split": "held_out",
              "documents": documents, "facts_per_document": facts, "seed": seed}
    same = {key: found[key] == wanted[key] for key in wanted}
    same["model"] = Path(record["model"]).resolve() == Path(checkpoint).resolve()  # paths may be spelled apart
    same["corpus"] = Path(corpus).resolve() == Path(data).resolve() and span == f"{TEST_SPLIT[0]}:{TEST_SPLIT[1]}"
    differ = [f"{key} {found[key]} (here {wanted[key]})" for key, agrees in same.items() if not agrees]
    missing = [f"no length {length}" for length in LENGTHS if length not in results]
    if differ or missing:
        raise SystemExit(f"--facts-from {path} measured something else: " + "; ".join(differ + missing))
    return {length: results[length] for length in LENGTHS}, record.get("command", f"(the record {path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--data", default="../shared/data/enwiki_excerpt.xml")
    parser.add_argument("--documents", type=int, default=8, help="fact documents per length")
    parser.add_argument("--facts", type=int, default=8)
    parser.add_argument("--haystacks", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trunk", help="a bare trunk trained with the same budget: the repeat probe's baseline")
    parser.add_argument("--bpb-bytes", type=int, help="score bits/byte and the repeat probe on the first this many "
                        "bytes of the test split (default: all of it; a large R is slow)")
    parser.add_argument("--training-command", default="kathleen-notebook train configuration/presets/demo.json")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the results do not depend on it)")
    parser.add_argument("--trunk-only", action="store_true",
                        help="only compare with --trunk, adding to the existing measurements file")
    parser.add_argument("--no-repeat-probe", action="store_true",
                        help="with --trunk: the trunk's bits/byte only (the repeat probe reads the text four times "
                             "with the model; at R = 524,288 that is over an hour on one thread)")
    parser.add_argument("--probe-batch", type=int, default=16,
                        help="windows the repeat probe scores at once (its memory grows with it; the results do "
                             "not depend on it)")
    parser.add_argument("--probe-lengths", type=int, nargs="+", default=(2048, 4096),
                        help="window lengths of the repeat probe (4x and 8x the training length); one per process "
                             "with --out runs them side by side")
    parser.add_argument("--facts-from", metavar="FACTS_JSON",
                        help="take the fact recall from this `kathleen-notebook facts --out` record")
    parser.add_argument("--skip", nargs="+", choices=SKIPPABLE, default=(),
                        help="leave these parts out (a second seed of a recipe needs no needle row; at R = 524,288 "
                             "the windows take as long as the stream)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.trunk_only and not args.trunk:
        parser.error("--trunk-only needs --trunk")
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # at R = 524,288 every call allocates large temporaries: keep their pages (same results)
    reused, facts_command = (facts_from(args.facts_from, args.checkpoint, args.data, args.documents, args.facts,
                                        args.seed) if args.facts_from else (None, None))
    model = NotebookSession.from_pretrained(args.checkpoint).model
    test = Path(args.data).read_bytes()[TEST_SPLIT[0]:TEST_SPLIT[1]]
    command = "python " + shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])  # no machine paths
    out = Path(args.out or Path(args.checkpoint) / "measurements.json")
    scored = test[:args.bpb_bytes]
    if args.trunk_only:
        trunk = compare_with_trunk(model, args.trunk, scored, not args.no_repeat_probe, args.probe_batch,
                                   args.probe_lengths)
        results = json.loads(out.read_text()) if out.exists() else {"bpb_bytes": len(scored)}  # the rest may be
        if results["bpb_bytes"] != len(scored):  # measured meanwhile, by another process
            raise SystemExit(f"{out} scored {results['bpb_bytes']:,} bytes, this run {len(scored):,}: same --bpb-bytes")
        out.write_text(json.dumps({**results, **trunk, "trunk_command": command}, indent=1))
        print(f"wrote {out}")
        return
    results = {"measure_command": command, "training_command": args.training_command,
               "facts_per_document": args.facts, "fact_documents": args.documents, "seed": args.seed,
               "threads": args.threads}
    results["bpb_bytes"] = len(scored)
    with torch.no_grad():
        results["test_bpb"] = bits_per_byte(model, bytes_to_ids(scored), progress="test bits/byte, stream")
        if "windows" not in args.skip:
            results["test_bpb_2048"] = bits_per_byte(model, bytes_to_ids(scored), window=2048,
                                                     progress="test bits/byte, windows")
    windows = f", {results['test_bpb_2048']:.4f} (windows 2048)" if "test_bpb_2048" in results else ""
    print(f"test split ({len(scored):,} bytes): {results['test_bpb']:.4f} bits/byte (stream){windows}", flush=True)
    facts = reused or evaluate_fact_recall(model, test, list(LENGTHS), args.documents, args.facts, args.seed)
    print(format_table(facts))
    results["fact_recall"] = facts
    if args.facts_from:
        results["facts_from"], results["facts_command"] = args.facts_from, facts_command
    for length in LENGTHS:
        results[f"fact_recall_{length}"] = facts[length]["greedy"]
    if "unlearning" not in args.skip:
        results["unlearning"] = unlearning_on_text(model, test, 2048, args.documents, args.facts, args.seed)
        print("unlearning at 2,048 bytes:", json.dumps(results["unlearning"]))
    if args.trunk:
        results.update(compare_with_trunk(model, args.trunk, scored, not args.no_repeat_probe, args.probe_batch,
                                   args.probe_lengths))
    elif out.exists():  # a comparison made by --trunk-only (kept only if it scored the same bytes)
        earlier = json.loads(out.read_text())
        if earlier.get("bpb_bytes") == len(scored):
            results.update({k: v for k, v in earlier.items() if k in TRUNK_KEYS})
    if "needle" not in args.skip:
        far = [recall_by_distance(model, n, args.haystacks, args.seed, False)["full"]["far"]
               for n in (512, 2048, 4096)]
        results["needle_recall"] = " / ".join("-" if v is None else f"{v:.3f}" for v in far)  # None: no far needle
    with torch.no_grad():
        cache = model(bytes_to_ids(test[:100]).unsqueeze(0)).cache
    results["cache_bytes"] = f"{sum(t.numel() * t.element_size() for t in cache.state_tensors().values()):,}"
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
