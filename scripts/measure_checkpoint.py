"""Measure a checkpoint for its model card: held-out bits/byte, fact recall and needle recall by length.

    python scripts/measure_checkpoint.py CHECKPOINT [--data ../shared/data/enwiki_excerpt.xml] \
        [--trials 10] [--facts 8] [--seed 0] [--out CHECKPOINT/measurements.json]

Test split = enwiki bytes [5,480,771, 6,089,746) (shared data README). Fact documents use test-split text
as filler. 1 thread; greedy decoding; seeds stated in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
from pathlib import Path

import torch

from modeling_kathleen_notebook.demo import accuracy, recall
from modeling_kathleen_notebook.facts import plant_facts, random_facts
from modeling_kathleen_notebook.memory import NotebookSession
from modeling_kathleen_notebook.needle_lab import recall_by_distance
from modeling_kathleen_notebook.scoring import bits_per_byte
from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

TEST_SPLIT = (5_480_771, 6_089_746)


def fact_recall(model, filler: bytes, length: int, n_facts: int, trials: int, seed: int) -> float:
    """Value-byte accuracy of greedy answers after reading `length`-byte documents with planted facts."""
    rng, scores = random.Random(seed * 1000 + length), []
    for _ in range(trials):
        facts = random_facts(n_facts, rng)
        room = length - sum(len(f.sentence) + 2 for f in facts)
        start = rng.randrange(len(filler) - room)
        document, _ = plant_facts(filler[start:start + room], facts, rng)
        session = NotebookSession(model)  # an empty memory for every document
        session.read(document)
        scores.append(accuracy(facts, recall(session, facts)))
    return sum(scores) / len(scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--data", default="../shared/data/enwiki_excerpt.xml")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--facts", type=int, default=8)
    parser.add_argument("--haystacks", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--training-command", default="kathleen-notebook train configuration/presets/demo.json")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = NotebookSession.from_pretrained(args.checkpoint).model
    test = Path(args.data).read_bytes()[TEST_SPLIT[0]:TEST_SPLIT[1]]
    command = "python " + shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])  # no machine paths
    results = {"measure_command": command, "training_command": args.training_command,
               "facts_per_document": args.facts, "recall_trials": args.trials}
    results["test_bpb"] = bits_per_byte(model, bytes_to_ids(test))
    results["test_bpb_2048"] = bits_per_byte(model, bytes_to_ids(test), window=2048)
    print(f"test split: {results['test_bpb']:.4f} bits/byte (stream), {results['test_bpb_2048']:.4f} (windows 2048)")
    for length in (512, 2048, 4096):
        results[f"fact_recall_{length}"] = fact_recall(model, test, length, args.facts, args.trials, args.seed)
        print(f"fact recall at {length}: {results[f'fact_recall_{length}']:.3f}", flush=True)
    far = [recall_by_distance(model, n, args.haystacks, args.seed, False)["full"]["far"] for n in (512, 2048, 4096)]
    results["needle_recall"] = " / ".join(f"{v:.3f}" for v in far)
    with torch.no_grad():
        cache = model(bytes_to_ids(test[:100]).unsqueeze(0)).cache
    results["cache_bytes"] = f"{sum(t.numel() * t.element_size() for t in cache.state_tensors().values()):,}"
    print(json.dumps(results, indent=1))
    out = Path(args.out or Path(args.checkpoint) / "measurements.json")
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
