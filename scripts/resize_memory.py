"""Give a trained checkpoint a larger (or smaller) notebook, and optionally calibrate its read scale there.

    python scripts/resize_memory.py runs/demo/final runs/demo/final-65536 --hrr-dim 65536 \
        [--calibrate --scales 8,12,16,24 --documents 6]

Nothing trained depends on R: the gate or surprise scale and shift, the read scale and the forget rate act on
numbers (β, hits, keep factors) whose meaning does not change with R, while the codebooks are fixed random tables
drawn from the config's key_seed. A larger R only lowers the crosstalk of many writes (noise σ² ≈ Σβ² / R), so a
model trained at a small R, where training is cheap, can read and write a large memory.

--calibrate then picks the read scale s among --scales (and, for surprise writes, the shift c among the trained c
plus --shifts) by greedy recall of facts from facts.py's *training* part planted in the enwiki validation slice
(never the held-out part or the test split), among the settings whose validation bits/byte (the first --bpb-bytes
of the slice, windows of 2,048) is within 0.01 of the trained setting's, breaking ties toward the trained setting.
Seeds: documents from --seed.
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
from modeling_kathleen_notebook.fact_recall import evaluate_fact_recall
from modeling_kathleen_notebook.notebook import make_codebooks
from modeling_kathleen_notebook.scoring import bits_per_byte
from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

VALIDATION = (5_180_771, 5_480_771)  # the last 300,000 bytes of the enwiki train split (shared data README)


def resized(model: KathleenForCausalLM, hrr_dim: int) -> KathleenForCausalLM:
    """The same model with a notebook of R = hrr_dim: every trained weight copied, the codebooks drawn anew from
    the config's key_seed at the new size."""
    config = KathleenConfig(**{**model.config.to_dict(), "hrr_dim": hrr_dim})
    bigger = KathleenForCausalLM(config).eval()
    codebooks = {f"model.memory.{name}" for name in make_codebooks(config)}
    weights = {k: v for k, v in model.state_dict().items() if k not in codebooks}
    missing, unexpected = bigger.load_state_dict(weights, strict=False)
    if set(missing) - codebooks or unexpected:
        raise ValueError(f"resizing could not carry over {sorted(set(missing) - codebooks)} {sorted(unexpected)}")
    return bigger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--hrr-dim", type=int, required=True, help="the new R (even)")
    parser.add_argument("--calibrate", action="store_true", help="choose the read scale on training-part facts")
    parser.add_argument("--scales", default="4,8,16", help="read scales to try with --calibrate")
    parser.add_argument("--shifts", default="0", help="with a surprise write rule: added to its trained shift c "
                        "(nats), e.g. 0,1 (a higher c writes less ordinary text)")
    parser.add_argument("--lengths", default="2048,8192", help="fact-document lengths of the calibration")
    parser.add_argument("--documents", type=int, default=4, help="calibration documents per length")
    parser.add_argument("--bpb-bytes", type=int, default=50_000, help="validation bytes scored per candidate")
    parser.add_argument("--seed", type=int, default=500)
    parser.add_argument("--data", default="../shared/data/enwiki_excerpt.xml")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = KathleenForCausalLM.from_pretrained(args.checkpoint).eval()
    if model.config.memory != "notebook":
        raise SystemExit(f"{args.checkpoint} has no notebook (memory={model.config.memory!r})")
    model = resized(model, args.hrr_dim)
    record = {"command": "python " + shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
              "hrr_dim": args.hrr_dim, "trained_read_scale": float(model.model.memory.read_scale)}
    if args.calibrate:
        validation = Path(args.data).read_bytes()[VALIDATION[0]:VALIDATION[1]]
        lengths = [int(x) for x in args.lengths.split(",")]
        memory = model.model.memory
        trained = (float(memory.read_scale), float(memory.surprise_shift) if model.config.uses_surprise else 0.0)
        shifts = [trained[1] + float(d) for d in args.shifts.split(",")] if model.config.uses_surprise else [0.0]
        trials = {}
        for scale in sorted({trained[0], *(float(s) for s in args.scales.split(","))}):
            for shift in shifts:
                with torch.no_grad():
                    memory.read_scale.fill_(scale)
                    if model.config.uses_surprise:
                        memory.surprise_shift.fill_(shift)
                    bpb = bits_per_byte(model, bytes_to_ids(validation[:args.bpb_bytes]), window=2048)
                recall = evaluate_fact_recall(model, validation, lengths, args.documents, 8, args.seed, "train",
                                              progress=False)
                trials[scale, shift] = {"recall": sum(r["greedy"] for r in recall.values()) / len(recall), "bpb": bpb}
                print(f"read scale {scale:g}, shift {shift:.2f}: training-part recall "
                      f"{trials[scale, shift]['recall']:.3f}, validation bits/byte {bpb:.4f}", flush=True)
        # the best recall among settings that cost at most 0.01 bits/byte over the trained one (a loud read is
        # noise on every byte); ties go to the setting nearest the trained one
        allowed = [key for key in trials if trials[key]["bpb"] <= trials[trained]["bpb"] + 0.01]
        best = max(allowed, key=lambda k: (round(trials[k]["recall"], 2),
                                           -abs(k[0] - trained[0]) - abs(k[1] - trained[1])))
        with torch.no_grad():
            memory.read_scale.fill_(best[0])
            if model.config.uses_surprise:
                memory.surprise_shift.fill_(best[1])
        record |= {"calibration": [{"read_scale": k[0], "shift": k[1], **v} for k, v in trials.items()],
                   "read_scale": best[0], "shift": best[1], "trained_shift": trained[1],
                   "calibration_lengths": lengths, "calibration_documents": args.documents, "seed": args.seed}
        print(f"chosen read scale {best[0]:g}, shift {best[1]:.2f}")
    model.save_pretrained(args.out)
    Path(args.out, "resize.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out} (R = {args.hrr_dim})")


if __name__ == "__main__":
    main()
