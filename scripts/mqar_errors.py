"""Where a trained MQAR arm's recall goes wrong (issue 19): accuracy per position in the value (first byte, second
byte, ...) and how many wrong guesses name the byte of another written key's value (a key confused with another)
rather than no pair's, on the MQAR lab's evaluation sequences (the same seed scheme, so the same sequences).

    python scripts/mqar_errors.py RUN_FOLDER [RUN_FOLDER ...] [--length 1024] [--pairs 8] [--examples 8] [--seed 0]
        [--key-length N]

RUN_FOLDER is an arm's folder of an MQAR lab run (its `final` model is loaded). Keys are as long as the run's
config.json's task says, or --key-length letters (a model trained on one key length, asked on another). One thread.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from modeling_kathleen_notebook.experiments.mqar import eval_sequences, value_byte_errors
from modeling_kathleen_notebook.training.config import MQARSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--examples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="the lab's eval seed")
    parser.add_argument("--key-length", type=int, help="letters per key (default: the run's training task's)")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    import modeling_kathleen_notebook  # noqa: F401  registers the Auto classes

    torch.set_num_threads(1)
    for run in args.runs:
        if not (run / "final").is_dir():
            raise SystemExit(f"{run / 'final'} is not a saved model: pass an arm's folder of an MQAR lab run")
        key_length = args.key_length
        if key_length is None:  # the run's own training task's
            try:
                task = MQARSpec(**json.loads((run / "config.json").read_text())["data"]["train"]["mqar"])
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise SystemExit(f"{run / 'config.json'} does not name an MQAR task ({error!r}): "
                                 "pass --key-length") from None
            key_length = task.key_length
        try:
            examples = eval_sequences(args.length, args.pairs, args.examples, args.seed, key_length=key_length)
        except ValueError as error:  # too short a sequence, a key length below 1, more pairs than keys
            raise SystemExit(f"mqar_errors.py: {error}") from None
        print(f"{run.name}: K = {args.pairs}, {args.length} bytes, {key_length}-letter keys, {args.examples} "
              f"sequences, eval seed {args.seed}, 1 thread")
        model = AutoModelForCausalLM.from_pretrained(run / "final").eval()
        total, right, confused = Counter(), Counter(), Counter()
        with torch.no_grad():
            for example in examples:
                logits = model(example.input_ids[None], use_cache=False).logits[0]
                for position, ok, other in value_byte_errors(example, logits):
                    total[position] += 1
                    right[position] += ok
                    confused[position] += other
        for position in sorted(total):
            wrong = total[position] - right[position]
            print(f"{run.name}: value byte {position + 1}: accuracy {right[position] / total[position]:.3f} "
                  f"({right[position]}/{total[position]}); wrong guesses naming another pair's byte: "
                  f"{confused[position]}/{wrong}")


if __name__ == "__main__":
    main()
