"""Screen a write rule on a checkpoint without building it: fact documents are read with the rule's write strengths
given as `write_mask`, then asked as `kathleen-notebook facts` asks them.

    python scripts/write_rule_screen.py MODEL [MODEL ...] --rules surprise carry:0.5 [--lengths 16384] \
        [--documents 3] [--seed 500] [--corpus ../shared/data/enwiki_excerpt.xml:5180771:5480771]

Rules, from the trunk's surprise S_t at each byte (nats) and the checkpoint's own a and c:
    surprise    β_t = sigmoid(a (S_t - c)), the checkpoint's rule (a control: it must equal the model's own β)
    carry:λ     β_t = sigmoid(a (S̃_t - c)), S̃_t = max(S_t, λ S̃_{t-1}): a surprise carries on to the bytes after
                it, so the rest of a word that began surprisingly is written too (a word's later letters are
                half-predictable to the trunk and so were written weakly: issue 18's misses at 16,384 bytes)

Prints and writes (--out) per model and rule: greedy and memory-only value-byte accuracy per length, by alphabet,
and Σβ² per byte of the documents (crosstalk grows with it). Default corpus: the validation slice; held-out facts.
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

from modeling_kathleen_notebook import KathleenForCausalLM
from modeling_kathleen_notebook.experiments.fact_recall import make_fact_document, score_document, summarise
from modeling_kathleen_notebook.notebook import trunk_surprise
from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids


def carried(surprise: torch.Tensor, decay: float) -> torch.Tensor:
    """S̃_t = max(S_t, decay · S̃_{t-1}) along the last dimension (sequential: the reference form)."""
    out = surprise.clone()
    for t in range(1, surprise.shape[-1]):
        out[..., t] = torch.maximum(surprise[..., t], decay * out[..., t - 1])
    return out


def rule_strengths(rule: str, surprise: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
    """β [B, T] of a rule named as in the module's docstring."""
    name, _, value = rule.partition(":")
    if name == "surprise" and not value:
        return torch.sigmoid(scale * (surprise - shift))
    if name == "carry" and value:
        return torch.sigmoid(scale * (carried(surprise, float(value)) - shift))
    raise SystemExit(f"unknown rule {rule!r}: surprise or carry:DECAY")


@torch.no_grad()
def screen(model, rules: list[str], filler: bytes, lengths: list[int], documents: int, seed: int,
           split: str) -> dict:
    """{rule: {length: summary + "beta_squared_per_byte"}} on the documents `kathleen-notebook facts` would draw."""
    notebook = model.model.memory
    scale, shift = notebook.surprise_scale.item(), notebook.surprise_shift.item()
    results = {rule: {} for rule in rules}
    for length in lengths:
        facts, squares = {rule: [] for rule in rules}, {rule: 0.0 for rule in rules}
        for d in range(documents):
            document = make_fact_document(filler, length, 8, random.Random(seed * 1_000_003 + length * 1_009 + d),
                                          split)
            ids = bytes_to_ids(document.text).unsqueeze(0)
            out = model(ids, output_write_strengths=True)
            last = notebook.empty_state(1, ids.device).last_logits
            surprise = trunk_surprise(ids, out.trunk_logits, last, None)[0]
            own = rule_strengths("surprise", surprise, scale, shift)
            if not torch.allclose(own, out.write_strengths, atol=1e-4):  # the screen must start from the model
                raise SystemExit("the surprise recomputed here is not the model's: not a surprise-writing notebook?")
            for rule in rules:
                beta = rule_strengths(rule, surprise, scale, shift)
                squares[rule] += beta.square().sum().item()
                facts[rule] += score_document(model, document, write_mask=beta)
                print(f"{length} doc {d} {rule}: greedy {summarise(facts[rule])['greedy']:.3f}", flush=True)
        for rule in rules:
            results[rule][length] = {**summarise(facts[rule]), "beta_squared_per_byte": squares[rule] / (
                length * documents)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--rules", nargs="+", default=["surprise", "carry:0.5"])
    parser.add_argument("--lengths", default="16384")
    parser.add_argument("--documents", type=int, default=3)
    parser.add_argument("--seed", type=int, default=500)
    parser.add_argument("--split", default="held_out", choices=("held_out", "train"))
    parser.add_argument("--corpus", default="../shared/data/enwiki_excerpt.xml:5180771:5480771")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    name, _, span = args.corpus.partition(":")
    start, end = (int(x) for x in span.split(":")) if span else (0, None)
    filler = Path(name).read_bytes()[start:end]
    lengths = [int(x) for x in args.lengths.split(",")]
    record = {"command": "python " + shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]), "models": {}}
    for path in args.models:
        model = KathleenForCausalLM.from_pretrained(path).eval()
        if model.config.memory != "notebook" or not model.config.uses_surprise:
            raise SystemExit(f"{path}: not a notebook that writes by the trunk's surprise")
        results = screen(model, args.rules, filler, lengths, args.documents, args.seed, args.split)
        record["models"][path] = results
        for rule, by_length in results.items():
            for length, row in by_length.items():
                alphabets = ", ".join(f"{a} {v['greedy']:.3f}" for a, v in row["by_alphabet"].items())
                print(f"{path} {rule} {length}: greedy {row['greedy']:.3f}, memory {row['memory']:.3f} "
                      f"({alphabets}); sum of beta^2 per byte {row['beta_squared_per_byte']:.4f}")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
