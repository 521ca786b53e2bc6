"""Fit a checkpoint's read trust (read_trust.py) with everything else frozen, and save the result.

    python scripts/fit_read_trust.py runs/demo/final-R32768-b runs/demo/final-R32768-t \
        [--lengths 512,2048,8192] [--documents 12] [--plain 4] [--steps 600] [--seed 0] [--features read] [--noise-cap]
        [--fact-weight 0] [--first-mention-weight 0] [--read-outs runs/read-outs.pt] [--keep-repeat-read-scale]
        [--repeat-read-trust] [--repeat-read-scale-init S]

The read trust decides, position by position, how many extra nats a sure read gets, from statistics that name no
phrasing (how far the read's best byte stands out, how sure the trunk is). It is fitted by next-byte
cross-entropy on fact documents (facts.py's *training* names and value alphabets in sentence shapes of random
words, each fact planted in enwiki train-split text and restated at the end) and plain train-split windows, plus
--fact-weight times the cross-entropy of the restated values alone (the bytes only a memory can predict; they are
about 1% of the positions, so without the weight the fit barely sees them), plus --first-mention-weight times
the cross-entropy of first mentions alone (SPEC §6.2: bytes of a word not yet seen in the document, where the
memory holds nothing for their key and every nat the read adds is crosstalk; the trunk's cross-entropy there is a
constant, so this weighs the repeat probe's first-mention cost).
The trunk and the notebook run once per document without gradients; only the trust's numbers learn: θ and τ,
and with --noise-cap the crosstalk c that the linear read may pass (otherwise c stays as it is, by default never
binding). --features read keeps θ's weights of the trunk's statistics at zero: k then depends on the read alone,
which knows nothing of the alphabet a value is written in. A model with a repeat bank (config.repeat_key_window)
has its two reads kept apart, the repeat bank's at unit scale, and the repeat bank's read scale s' is fitted with
the trust (the trust then sees first read + s' · repeat read, as the model adds them) unless
--keep-repeat-read-scale. --repeat-read-trust gives the repeat bank a trust of its own (config.repeat_read_trust;
a new one starts as the config's initial trust) and fits both: each read then passes its own before they are added.
--repeat-read-scale-init starts s' elsewhere than as loaded: the fit finds a worse minimum from some starts (from
s' = 4 a trust per memory ends 0.07 bits/byte above its fit from s' = 1 on the shipped checkpoint:
reports/repeat_trust.md).
Bits/byte before and after are printed for the fitting data and for the validation slice (fact documents and
plain text), which the fit never sees, with the share of restated value bytes predicted right (teacher-forced)
and the first-mention cost (bits/byte on first mentions, the model's minus its trunk's logits alone);
held-out phrasings and the test split are left to scripts/measure_checkpoint.py. Seeds: documents and batches
from --seed; 1 thread by default. Reading the documents is most of the work at a large R: --read-outs FILE keeps
what was read, and a later fit of the same model on the same documents (other weights, steps or features) starts
from it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import random
import shlex
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from modeling_kathleen_notebook import KathleenForCausalLM
from modeling_kathleen_notebook.experiments.facts import NAMES, fact_document_and_values, novel_templates
from modeling_kathleen_notebook.experiments.repeat_probe import FIRST, classify_bytes
from modeling_kathleen_notebook.notebook import Notebook
from modeling_kathleen_notebook.read_trust import FEATURES, READ_FEATURES, ReadTrust
from modeling_kathleen_notebook.scan_read import scan_and_read
from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

TRAIN, VALIDATION = "0:5180771", "5180771:5480771"  # enwiki splits of the demo preset (shared data README)
READ_OUTS_FORMAT = 2  # the columns of `read_outs`; 2: the repeat bank's read kept apart (a file of 1 is read again)


class BankReads:
    """scan_and_read that keeps what each call read: a notebook runs it once per memory, the first memory's first
    (`Notebook.forward`)."""

    def __init__(self):
        self.reads: list[torch.Tensor] = []

    def __call__(self, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        reads, spectrum = scan_and_read(*args, **kwargs)
        self.reads.append(reads)
        return reads, spectrum


@torch.no_grad()
def read_outs(model: KathleenForCausalLM, texts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
              desc: str) -> tuple[torch.Tensor, ...]:
    """(trunk logits, the first memory's untrusted read, the repeat bank's at read scale 1 ([N, 0] without one), next
    bytes, whether the next byte is a restated value, whether it is in a first mention) at every position of every
    (ids, value mask, first-mention mask) text, concatenated. β does not depend on the reads, so one pass gives both."""
    notebook = model.model.memory
    repeat_bank = bool(notebook.config.repeat_key_window)
    if repeat_bank:
        repeat_scale = notebook.repeat_read_scale.item()
        notebook.repeat_read_scale.fill_(1.0)
    rows, reads = [], BankReads()
    notebook.forward = functools.partial(Notebook.forward, notebook, operation=reads)  # undone below
    try:
        for ids, values, first in tqdm(texts, desc=desc, leave=False):
            reads.reads.clear()
            out = model(ids.unsqueeze(0), use_cache=False)
            repeat = reads.reads[1][0, :-1] if repeat_bank else out.trunk_logits.new_zeros(len(ids) - 1, 0)
            rows.append((out.trunk_logits[0, :-1], reads.reads[0][0, :-1], repeat, ids[1:], values[1:], first[1:]))
    finally:
        notebook.__dict__.pop("forward", None)
        if repeat_bank:
            notebook.repeat_read_scale.fill_(repeat_scale)
    return tuple(torch.cat(column) for column in zip(*rows))


def memory_logits(notebook: Notebook, data: tuple[torch.Tensor, ...], repeat_scale: torch.Tensor | float
                  ) -> torch.Tensor:
    """The untrusted reads as the model hands them to its trust: the first read and s' times the repeat bank's,
    added or side by side (`Notebook.combine`)."""
    memory, repeat = data[1], data[2]
    return notebook.combine([memory, repeat_scale * repeat]) if repeat.shape[-1] else memory


def first_mentions(ids: torch.Tensor) -> torch.Tensor:
    """Mask [N] of the bytes of a document's first mentions (the repeat probe's classes over the whole document)."""
    kind, _ = classify_bytes(bytes((ids - 3).clamp(0, 255).tolist()), window=len(ids))
    return kind == FIRST


def documents(text: bytes, lengths: list[int], n_facts: int, n_plain: int,
              rng: random.Random) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(ids, value mask, first-mention mask): n_facts fact documents per length and n_plain plain windows per
    length. The facts take
    the training part's names and value alphabets but sentence shapes of random words (facts.novel_templates): a
    trunk that learned to defer to the memory on its training templates does not defer on these, as on any new
    phrasing."""
    out = []
    for length in lengths:
        for kind in ["facts"] * n_facts + ["plain"] * n_plain:
            start = rng.randrange(len(text) - 2 * length)
            filler = text[start:start + 2 * length]
            if kind == "facts":
                shapes = novel_templates(filler, 12, rng)
                planted = min(len(NAMES["train"]), max(1, length // 256))  # facts need names of their own
                ids, values = fact_document_and_values(filler, length, planted, rng, "train", shapes)
            else:
                ids, values = bytes_to_ids(text[start:start + length]), torch.zeros(length, dtype=torch.bool)
            out.append((ids, values, first_mentions(ids)))
    return out


def lengths_list(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers expected, got {text!r}") from None
    if min(lengths) < 256:
        raise argparse.ArgumentTypeError(f"documents need at least 256 bytes, got {min(lengths)}")
    return lengths


def read_outs_key(model: KathleenForCausalLM, args: argparse.Namespace) -> str:
    """What the untrusted read-outs depend on: the model's weights but its trust's and the repeat read scale (the
    repeat bank's read is kept at scale 1), its config, the documents."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if not any(part in name for part in (".trust.", ".repeat_trust.", "repeat_read_scale")):
            digest.update(name.encode() + tensor.detach().contiguous().cpu().numpy().tobytes())
    config = {k: v for k, v in model.config.to_dict().items()
              if k not in ("read_trust", "repeat_read_trust", "transformers_version")}
    texts = [args.data, args.train_bytes, args.validation_bytes, args.lengths, args.documents, args.plain, args.seed]
    return json.dumps([READ_OUTS_FORMAT, digest.hexdigest(), config, texts], sort_keys=True, default=str)


def cached_read_outs(model: KathleenForCausalLM, args: argparse.Namespace, train: bytes,
                     validation: bytes) -> tuple[tuple[torch.Tensor, ...], dict[str, tuple[torch.Tensor, ...]]]:
    """The fitting data's read-outs and the validation slice's (facts, plain), from --read-outs when it holds this
    model's on these documents, else read (and written there)."""
    key = read_outs_key(model, args) if args.read_outs else None
    if args.read_outs and Path(args.read_outs).exists():
        try:
            saved = torch.load(args.read_outs, weights_only=True)
        except Exception as error:  # a truncated or foreign file: read again
            print(f"{args.read_outs} unreadable ({type(error).__name__}): reading the documents again")
        else:
            if saved.get("key") == key:
                print(f"read-outs from {args.read_outs}")
                return tuple(saved["fit"]), {kind: tuple(saved[kind]) for kind in ("facts", "plain")}
            print(f"{args.read_outs} holds another model's or other documents' read-outs: reading again")
    rng = random.Random(args.seed)
    fit = read_outs(model, documents(train, args.lengths, args.documents, args.plain, rng), "reading")
    held = {kind: read_outs(model, documents(validation, args.lengths, args.documents * (kind == "facts"),
                                             args.plain * (kind == "plain"), rng), f"validation {kind}")
            for kind in ("facts", "plain")}
    if args.read_outs:
        Path(args.read_outs).parent.mkdir(parents=True, exist_ok=True)
        partial = Path(f"{args.read_outs}.partial")
        torch.save({"key": key, "fit": list(fit), **{kind: list(v) for kind, v in held.items()}}, partial)
        partial.replace(args.read_outs)  # never a half-written file under the name
    return fit, held


def scores(model: KathleenForCausalLM, data: tuple[torch.Tensor, ...], trusted: bool = True) -> dict:
    """Bits/byte over every position, the share of restated value bytes whose argmax is right (None without any),
    and the first-mention cost: bits/byte on first mentions, the model's minus its trunk's logits alone; with the
    model's repeat read scale."""
    notebook = model.model.memory
    trunk, _, _, targets, values, first = data
    with torch.no_grad():
        reads = memory_logits(notebook, data, notebook.repeat_read_scale if notebook.config.repeat_key_window else 0.0)
        memory = notebook.trusted(reads, trunk) if trusted else reads.unflatten(-1, (-1, trunk.shape[-1])).sum(-2)
        logits = trunk + memory
        hits = (logits[values].argmax(-1) == targets[values]).float()
        cost = F.cross_entropy(logits[first], targets[first]) - F.cross_entropy(trunk[first], targets[first])
        return {"bits_per_byte": F.cross_entropy(logits, targets).item() / math.log(2),
                "value_accuracy": hits.mean().item() if len(hits) else None,
                "first_mention_cost": cost.item() / math.log(2) if first.any() else None}


def fitted_numbers(trust: ReadTrust) -> dict:
    """A trust's θ, τ and cap c, for the record."""
    return {"weights": trust.weights.tolist(), "threshold": trust.threshold.item(),
            "noise_cap": trust.log_noise_cap.exp().item()}


def summary(row: dict) -> str:
    """One line of a scores() row."""
    text = f"bits/byte {row['bits_per_byte']:.4f}"
    if row["value_accuracy"] is not None:
        text += f", restated values {row['value_accuracy']:.3f}"
    if row["first_mention_cost"] is not None:
        text += f", first-mention cost {row['first_mention_cost']:+.4f}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--data", default="../shared/data/enwiki_excerpt.xml")
    parser.add_argument("--train-bytes", default=TRAIN, help="START:END of --data the fit reads")
    parser.add_argument("--validation-bytes", default=VALIDATION, help="START:END of --data it is checked on")
    parser.add_argument("--lengths", type=lengths_list, default="512,2048,8192", help="document lengths (bytes)")
    parser.add_argument("--documents", type=int, default=12, help="fact documents per length")
    parser.add_argument("--plain", type=int, default=4, help="plain-text windows per length")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=8192, help="positions per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--features", choices=("all", "read"), default="all",
                        help="the statistics k may use: all six, or the read's own three")
    parser.add_argument("--noise-cap", action="store_true", help="also fit the linear read's crosstalk cap c")
    parser.add_argument("--fact-weight", type=float, default=0.0,
                        help="weight of the restated values' own cross-entropy beside that of every position")
    parser.add_argument("--first-mention-weight", type=float, default=0.0,
                        help="weight of the first mentions' own cross-entropy beside that of every position")
    parser.add_argument("--read-outs", help="file that keeps the documents' read-outs for later fits of this model")
    parser.add_argument("--keep-repeat-read-scale", action="store_true",
                        help="with a repeat bank: fit the trust only, its read scale as loaded")
    parser.add_argument("--repeat-read-scale-init", type=float,
                        help="with a repeat bank: the read scale s' the fit starts from (default: as loaded)")
    parser.add_argument("--repeat-read-trust", action="store_true",
                        help="with a repeat bank: give it a read trust of its own (a new one if it has none)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    try:
        extra = {"repeat_read_trust": True} if args.repeat_read_trust else {}
        model = KathleenForCausalLM.from_pretrained(args.checkpoint, read_trust=True, **extra).eval()
    except (OSError, ValueError) as error:
        raise SystemExit(f"cannot load {args.checkpoint}: {str(error).splitlines()[0]}") from None
    if model.config.memory != "notebook":
        raise SystemExit(f"{args.checkpoint} has no notebook (memory={model.config.memory!r})")
    for flag, asked in (("--keep-repeat-read-scale", args.keep_repeat_read_scale),
                        ("--repeat-read-trust", args.repeat_read_trust),
                        ("--repeat-read-scale-init", args.repeat_read_scale_init is not None)):
        if asked and not model.config.repeat_key_window:
            raise SystemExit(f"{flag}: {args.checkpoint} has no repeat bank (repeat_key_window = 0)")
    if args.repeat_read_scale_init is not None and args.keep_repeat_read_scale:
        raise SystemExit("--repeat-read-scale-init and --keep-repeat-read-scale contradict each other")
    corpus = Path(args.data).read_bytes()
    train, validation = (corpus[slice(*map(int, span.split(":")))]
                         for span in (args.train_bytes, args.validation_bytes))
    for name, part in (("--train-bytes", train), ("--validation-bytes", validation)):
        if len(part) <= 2 * max(args.lengths):
            raise SystemExit(f"{name} holds {len(part):,} bytes of {args.data}: documents of {max(args.lengths):,} "
                             f"bytes need more than {2 * max(args.lengths):,}")
    if args.documents < 1 or args.steps < 0:
        raise SystemExit("--documents must be ≥ 1 and --steps ≥ 0")
    fit, held = cached_read_outs(model, args, train, validation)
    before = {"fit": scores(model, fit, trusted=False), **{k: scores(model, v, trusted=False) for k, v in held.items()}}
    loaded = {"fit": scores(model, fit), **{k: scores(model, v) for k, v in held.items()}}  # the trust as it came

    notebook = model.model.memory
    trusts = [trust for trust in (notebook.trust, notebook.repeat_trust) if trust is not None]
    unused = torch.tensor([name not in READ_FEATURES for name in FEATURES]) if args.features == "read" else None
    fitted = [p for trust in trusts for p in (trust.weights, trust.threshold)]
    repeat_bank = bool(model.config.repeat_key_window)
    repeat_scale = notebook.repeat_read_scale.detach().clone() if repeat_bank else torch.zeros(())
    if args.repeat_read_scale_init is not None:
        repeat_scale.fill_(args.repeat_read_scale_init)
    if repeat_bank and not args.keep_repeat_read_scale:
        fitted.append(repeat_scale.requires_grad_())
    with torch.no_grad():
        for trust in trusts:
            if unused is not None:
                trust.weights[unused] = 0.0
            if args.noise_cap:
                trust.log_noise_cap.fill_(0.0)  # start at 1 nat of crosstalk
                fitted.append(trust.log_noise_cap)
    optimizer = torch.optim.Adam(fitted, lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    value_rows, first_rows = fit[4].nonzero().flatten(), fit[5].nonzero().flatten()

    def cross_entropy(batch: torch.Tensor) -> torch.Tensor:
        rows = tuple(column[batch] for column in fit)
        trunk, targets = rows[0], rows[3]
        return F.cross_entropy(trunk + notebook.trusted(memory_logits(notebook, rows, repeat_scale), trunk), targets)

    for _ in tqdm(range(args.steps), desc="fitting the read trust"):
        loss = cross_entropy(torch.randint(len(fit[0]), (args.batch,), generator=generator))
        for weight, rows in ((args.fact_weight, value_rows), (args.first_mention_weight, first_rows)):
            if weight and len(rows):
                batch = rows[torch.randint(len(rows), (min(args.batch, len(rows)),), generator=generator)]
                loss = loss + weight * cross_entropy(batch)
        optimizer.zero_grad()
        loss.backward()
        for trust in trusts:
            if unused is not None:
                trust.weights.grad[unused] = 0.0  # Adam moves no weight whose gradient is always zero
        optimizer.step()
    if repeat_bank:
        with torch.no_grad():
            notebook.repeat_read_scale.copy_(repeat_scale)
    after = {"fit": scores(model, fit), **{k: scores(model, v) for k, v in held.items()}}
    for name in before:
        print(f"{name}: untrusted read {summary(before[name])}\n  trust as loaded {summary(loaded[name])}\n"
              f"  fitted trust {summary(after[name])}")
    model.save_pretrained(args.out)
    record = {"command": "python " + shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
              **fitted_numbers(notebook.trust), "features": args.features, "fact_weight": args.fact_weight,
              "first_mention_weight": args.first_mention_weight,
              "repeat_read_scale": notebook.repeat_read_scale.item() if repeat_bank else None,
              "repeat_trust": None if notebook.repeat_trust is None else fitted_numbers(notebook.repeat_trust),
              "positions": len(fit[0]), "value_positions": len(value_rows),
              "before": before, "loaded": loaded, "after": after}
    Path(args.out, "read_trust.json").write_text(json.dumps(record, indent=1))
    for history in ("resize.json", "training.json"):  # the checkpoint's history travels with it (model card)
        if Path(args.checkpoint, history).exists():
            shutil.copy(Path(args.checkpoint, history), Path(args.out, history))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
