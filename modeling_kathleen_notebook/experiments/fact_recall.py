"""Fact recall on real text (issue 18): does a checkpoint remember facts it read once, at any length?

    kathleen-notebook facts MODEL [--corpus FILE[:START:END]] [--lengths 512,2048,...] [--documents 8]

A document is `length` bytes of real prose with N facts (facts.py) planted once at word boundaries. After
reading it the model is asked each fact separately, from the state the document left (the questions do not
see each other), by restating the fact's sentence up to its value:

    teacher-forced   value bytes whose argmax is right given the true bytes before them, read three ways:
                     full logits, memory-only logits, trunk-only logits
    greedy           value bytes the model writes itself, byte by byte (what a user sees)

Scores are value-byte accuracies, by length, by which half of the document the fact was read in, and by
distance (bytes from the end of the fact's sentence to the end of the document). `unlearning_on_text` reads
documents into a `NotebookSession`, unlearns one fact sentence and asks every fact again; with one_shape every fact
of a document has the same sentence shape, so their questions end in the same bytes (what a repeat bank's short
keys cannot tell apart).
"""

from __future__ import annotations

import copy
import logging
import random
from dataclasses import dataclass

import torch

from ..configuration_kathleen import PAD_ID
from ..tokenization_kathleen import bytes_to_ids
from .facts import TEMPLATES, Fact, FactGenerator, plant_facts, planted_length

logger = logging.getLogger(__name__)

READOUTS = ("full", "memory", "trunk")
DISTANCE_BINS = ((0, 512), (512, 2048), (2048, 8192), (8192, None))


@dataclass
class FactDocument:
    """Real text with planted facts; spans[i] is where facts[i]'s sentence sits in text."""

    text: bytes
    facts: list[Fact]
    spans: list[tuple[int, int]]


def make_fact_document(filler: bytes, length: int, n_facts: int, rng: random.Random,
                       split: str = "held_out", templates: tuple[str, ...] | None = None) -> FactDocument:
    """A `length`-byte document: a random stretch of `filler` (starting after a space) with n_facts planted
    (`templates`: the sentence shapes to use instead of the split's)."""
    facts = FactGenerator(split, templates).facts(n_facts, rng)
    room = length - planted_length(facts)
    if room <= 0 or len(filler) <= room + 64:
        raise ValueError(f"a {length}-byte document cannot hold {n_facts} facts in a filler of {len(filler):,} bytes")
    start = rng.randrange(len(filler) - room - 64)
    start = filler.find(b" ", start, start + 64) + 1 or start  # begin at a word
    text, spans = plant_facts(filler[start:start + room], facts, rng)
    return FactDocument(text, facts, spans)


def left_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] and attention mask [B, T] of 1-D id tensors, padded on the left."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, T - len(row):], mask[i, T - len(row):] = row, 1
    return ids, mask


@torch.no_grad()
def score_document(model, document: FactDocument, greedy: bool = True,
                   write_mask: torch.Tensor | None = None) -> list[dict]:
    """Read the document, then ask every fact from the state it left. Per fact: distance, position, and hits
    per value byte ({readout: [bool]} teacher-forced, "greedy": [bool]). `write_mask` [1, len(text)] replaces the
    notebook's write strengths while it reads the document (a write rule tried without building it)."""
    out = model(bytes_to_ids(document.text).unsqueeze(0), use_cache=True, logits_to_keep=1, write_mask=write_mask)
    facts, n = document.facts, len(document.facts)
    queries = [bytes_to_ids(f.query.encode()) for f in facts]
    values = [bytes_to_ids(f.value.encode()) for f in facts]

    def from_document():  # the document's state, once per question
        cache = copy.deepcopy(out.cache)
        cache.batch_repeat_interleave(n)
        return cache

    ids, mask = left_padded([torch.cat([q, v]) for q, v in zip(queries, values)])
    asked = model(ids, attention_mask=mask, cache=from_document(), use_cache=False)
    T, results = ids.shape[1], []
    for i, value in enumerate(values):
        first = T - len(value) - 1  # the position whose logits predict the first value byte
        rows = slice(first, first + len(value))
        hits = {name: (logits[i, rows].argmax(-1) == value).tolist()
                for name, logits in (("full", asked.logits), ("memory", asked.memory_logits),
                                     ("trunk", asked.trunk_logits)) if logits is not None}
        start, end = document.spans[i]
        results.append({"distance": len(document.text) - end, "first_half": start < len(document.text) / 2,
                        "alphabet": facts[i].alphabet, **hits})
    if greedy:
        for result, written, value in zip(results, greedy_answers(model, queries, values, from_document()), values):
            result["greedy"] = (written == value).tolist()
    return results


def greedy_answers(model, queries: list[torch.Tensor], values: list[torch.Tensor], cache) -> list[torch.Tensor]:
    """Each query's greedy continuation, as long as its value: [len(value)] ids per query."""
    ids, mask = left_padded(queries)
    out = model(ids, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=1)
    written = [out.logits[:, -1].argmax(-1)]
    for _ in range(max(len(v) for v in values) - 1):
        out = model(written[-1].unsqueeze(1), cache=out.cache, use_cache=True)
        written.append(out.logits[:, -1].argmax(-1))
    answers = torch.stack(written, dim=1)
    return [answers[i, :len(v)] for i, v in enumerate(values)]


def session_answers(session, facts: list[Fact]) -> list[str]:
    """Greedy answers of a `NotebookSession` to every fact's query, each as long as the fact's value."""
    from ..tokenization_kathleen import ids_to_bytes

    answers = []
    for fact in facts:
        ids = session.ask(fact.query, max_new_tokens=len(fact.value.encode()), do_sample=False, eos_token_id=None)
        answers.append(ids_to_bytes(ids).decode("utf-8", "replace"))
    return answers


def borrows_another_value(answer: str, others: list[Fact]) -> bool:
    """Whether an answer is another fact's value: it matches one on at least half of that value's bytes."""
    return any(2 * sum(a == b for a, b in zip(other.value, answer)) >= len(other.value) for other in others)


def value_accuracy(facts: list[Fact], answers: list[str]) -> float:
    """Share of value bytes answered exactly."""
    hits = sum(a == b for fact, answer in zip(facts, answers)
               for a, b in zip(fact.value, answer.ljust(len(fact.value))))
    return hits / sum(len(f.value) for f in facts)


@torch.no_grad()
def unlearning_on_text(model, filler: bytes, length: int, documents: int, n_facts: int = 8, seed: int = 0,
                       split: str = "held_out", one_shape: bool = False, clear_shared_keys: bool = False) -> dict:
    """Per document: read it into a session (each fact sentence a segment), ask every fact (greedy), unlearn
    one fact's sentence (`NotebookSession.unlearn`'s clear_shared_keys), ask again. one_shape: every fact of
    document d has the same template, the d-th (mod their number) of the split's templates whose question keeps at
    least 4 bytes of the name in the first memory's key (`key_window`: the others' facts no key tells apart).
    Returns the erased fact's recall before / after, the share of erased facts answered with another fact's value
    after (`borrows_another_value`), the other facts' recall before / after, and the trunk-only teacher-forced
    accuracy of the erased facts (what no memory gets)."""
    from ..session import NotebookSession

    erased_before, erased_after, kept_before, kept_after, trunk_only, borrowed = [], [], [], [], [], []
    gap = model.config.key_window - 4  # bytes between the name and the value that leave 4 of the name in the key
    distinguishable = [t for t in TEMPLATES[split] if len(t.split("{name}")[1].split("{value}")[0]) <= gap]
    if one_shape and not distinguishable:
        raise ValueError(f"no {split} template keeps 4 bytes of the name in a key of {model.config.key_window} bytes")
    for d in range(documents):
        rng = random.Random(seed * 1_000_003 + length * 1_009 + d + 7_777)
        shapes = (distinguishable[d % len(distinguishable)],) if one_shape else None
        document = make_fact_document(filler, length, n_facts, rng, split, shapes)
        session = NotebookSession(model)
        session.read(document.text, segments=document.spans)
        before = session_answers(session, document.facts)
        victim = d % n_facts
        session.unlearn(span=document.spans[victim], clear_shared_keys=clear_shared_keys)
        after = session_answers(session, document.facts)
        others = [i for i in range(n_facts) if i != victim]
        borrowed.append(float(borrows_another_value(after[victim], [document.facts[i] for i in others])))
        erased_before.append(value_accuracy([document.facts[victim]], [before[victim]]))
        erased_after.append(value_accuracy([document.facts[victim]], [after[victim]]))
        kept_before.append(value_accuracy([document.facts[i] for i in others], [before[i] for i in others]))
        kept_after.append(value_accuracy([document.facts[i] for i in others], [after[i] for i in others]))
        trunk_only.append(mean([score_document(model, document, greedy=False)[victim]["trunk"]]))

    def average(values):
        return sum(values) / len(values)

    return {"length": length, "documents": documents, "erased_before": average(erased_before),
            "erased_after": average(erased_after), "erased_borrowed_after": average(borrowed),
            "kept_before": average(kept_before),
            "kept_after": average(kept_after), "erased_trunk_only": average(trunk_only)}


def mean(hits: list[list[bool]]) -> float | None:
    flat = [h for row in hits for h in row]
    return sum(flat) / len(flat) if flat else None


def summarise(facts: list[dict]) -> dict:
    """Accuracies over a list of per-fact results: every readout, by half, by distance bin and by alphabet."""
    readouts = [r for r in (*READOUTS, "greedy") if facts and r in facts[0]]
    summary = {r: mean([f[r] for f in facts]) for r in readouts}
    summary["facts"] = len(facts)
    for half, name in ((True, "first_half"), (False, "second_half")):
        chosen = [f for f in facts if f["first_half"] == half]
        summary[name] = {r: mean([f[r] for f in chosen]) for r in readouts} | {"facts": len(chosen)}
    summary["by_distance"] = {}
    for low, high in DISTANCE_BINS:
        chosen = [f for f in facts if f["distance"] >= low and (high is None or f["distance"] < high)]
        if chosen:
            label = f"{low}-{high}" if high is not None else f">={low}"
            summary["by_distance"][label] = {r: mean([f[r] for f in chosen]) for r in readouts} | {"facts": len(chosen)}
    summary["by_alphabet"] = {a: {r: mean([f[r] for f in facts if f["alphabet"] == a]) for r in readouts}
                              for a in sorted({f["alphabet"] for f in facts})}
    return summary


def evaluate_fact_recall(
    model,
    filler: bytes,
    lengths: list[int],
    documents: int = 8,
    n_facts: int = 8,
    seed: int = 0,
    split: str = "held_out",
    greedy: bool = True,
    progress: bool = True,
) -> dict:
    """{length: summary} over `documents` documents per length; document d of length L is drawn from
    random.Random(seed · 1,000,003 + L · 1,009 + d), so every model sees the same documents."""
    from tqdm.auto import tqdm

    results = {}
    bar = tqdm(total=len(lengths) * documents, desc="fact recall", disable=not progress)
    for length in lengths:
        facts = []
        for d in range(documents):
            rng = random.Random(seed * 1_000_003 + length * 1_009 + d)
            facts += score_document(model, make_fact_document(filler, length, n_facts, rng, split), greedy)
            bar.update(1)
        results[length] = summarise(facts)
        logger.info("fact recall at %d bytes: %s", length,
                    {k: round(v, 3) for k, v in results[length].items() if isinstance(v, float)})
    bar.close()
    return results


def format_table(results: dict) -> str:
    """A Markdown table of the headline accuracies by length."""
    lines = ["| length | greedy | teacher-forced full | memory only | trunk only | first half (greedy) | "
             "second half (greedy) |", "|---|---|---|---|---|---|---|"]

    def cell(value):
        return "-" if value is None else f"{value:.3f}"

    for length, s in results.items():
        lines.append(f"| {int(length):,} | {cell(s.get('greedy'))} | {cell(s.get('full'))} | {cell(s.get('memory'))} | "
                     f"{cell(s.get('trunk'))} | {cell(s['first_half'].get('greedy'))} | "
                     f"{cell(s['second_half'].get('greedy'))} |")
    return "\n".join(lines)
