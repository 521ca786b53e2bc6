"""How much could a notebook that writes what surprised the trunk recall? A grid over the memory size R, the
surprise rule β = sigmoid(a (S - c)) and the read scale s, on one trained trunk, with nothing else trained.

    python scripts/write_rule_grid.py runs/facts/surprise-s42/final \
        --grid 4096,4,1,16 65536,4,1,16 65536,3,2,16 --lengths 512,2048,8192,16384 --documents 3

Each grid point takes the checkpoint's trunk and byte head, and a fresh notebook with bound keys, no forgetting
and the given R, a, c (nats) and s. Held-out facts (facts.py) in the enwiki test split, seed 1000 as in the fact
laboratory. This is how the shipped recipe's memory size and read scale were chosen (reports/facts.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

import torch

from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
from modeling_kathleen_notebook.experiments.fact_recall import evaluate_fact_recall

TEST_SPLIT = (5_480_771, 6_089_746)


def surprise_notebook(trunk: KathleenForCausalLM, hrr_dim: int, shift: float, scale: float,
                      read_scale: float) -> KathleenForCausalLM:
    """The trunk's weights under a fresh notebook that writes β = sigmoid(scale · (S - shift))."""
    config = KathleenConfig(**{**trunk.config.to_dict(), "memory": "notebook", "hrr_dim": hrr_dim,
                               "key_binding": "bind", "write_signal": "surprise", "forgetting": False,
                               "surprise_scale_init": scale, "surprise_shift_init": shift,
                               "read_scale_init": read_scale})
    torch.manual_seed(0)
    model = KathleenForCausalLM(config).eval()
    trunk_weights = {k: v for k, v in trunk.state_dict().items() if not k.startswith("model.memory.")}
    missing, unexpected = model.load_state_dict(trunk_weights, strict=False)
    if unexpected or any(not k.startswith("model.memory.") for k in missing):
        raise ValueError(f"not a Kathleen trunk: missing {missing}, unexpected {unexpected}")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a trained KathleenForCausalLM (its notebook, if any, is replaced)")
    parser.add_argument("--grid", nargs="+", required=True, metavar="R,c,a,s",
                        help="memory size, surprise shift (nats), surprise scale (per nat), read scale")
    parser.add_argument("--lengths", default="512,2048,8192,16384")
    parser.add_argument("--documents", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--data", default="../shared/data/enwiki_excerpt.xml")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    trunk = KathleenForCausalLM.from_pretrained(args.checkpoint).eval()
    test = Path(args.data).read_bytes()[TEST_SPLIT[0]:TEST_SPLIT[1]]
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for point in args.grid:
        R, c, a, s = (float(x) for x in point.split(","))
        model = surprise_notebook(trunk, int(R), c, a, s)
        recall = evaluate_fact_recall(model, test, lengths, args.documents, 8, args.seed, progress=False)
        rows.append({"hrr_dim": int(R), "shift": c, "scale": a, "read_scale": s,
                     "greedy": {L: r["greedy"] for L, r in recall.items()},
                     "teacher_forced": {L: r["full"] for L, r in recall.items()},
                     "memory_only": {L: r["memory"] for L, r in recall.items()}})
        print(f"R {int(R):>6}  c {c:g}  a {a:g}  s {s:g}   greedy " +
              " ".join(f"{L}: {r['greedy']:.2f}" for L, r in recall.items()) + "   teacher-forced " +
              " ".join(f"{r['full']:.2f}" for r in recall.values()), flush=True)
    if args.out:
        command = "python " + shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])
        Path(args.out).write_text(json.dumps({"command": command, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
