"""The needle task of SPEC §6.1: facts planted in a haystack, one of them queried at the end.

    filler words ... <MARK>keyvalue ... filler ... <MARK>keyvalue ... <MARK>key|value   <- scored

`<MARK>key` is 7 bytes (`CONTEXT_BYTES`), the key window of the notebooks built for this task ([KR]'s), so the
first value byte has an exact context match (SPEC §3).

Keys and values are 6 random lowercase letters; the marker is one byte that filler never contains.
Everything is byte-exact and drawn from a `random.Random`, so a seed fixes the example.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import torch

from ..configuration_kathleen import BYTE_OFFSET

MARKER = b"\x01"
KEY_LENGTH = VALUE_LENGTH = 6
# "<MARK>key": the context these tasks (and MQAR's) are built for, the notebook key window of the models that run
# them; a longer window would also span the bytes before it, which differ between a fact and its query
CONTEXT_BYTES = len(MARKER) + KEY_LENGTH
LETTERS = string.ascii_lowercase.encode()


def span_labels(input_ids: torch.Tensor, spans) -> torch.Tensor:
    """Labels [T]: input_ids inside the [start, end) spans, -100 (ignored by the loss) elsewhere."""
    labels = torch.full_like(input_ids, -100)
    for start, end in spans:
        labels[start:end] = input_ids[start:end]
    return labels


@dataclass
class NeedleExample:
    """One haystack as token ids, with where its facts and its query are."""

    input_ids: torch.Tensor  # [T] long
    needle_spans: list[tuple[int, int]]  # [start, end) of each planted "<MARK>keyvalue"
    value_span: tuple[int, int]  # [start, end) of the queried value at the end (the scored bytes)
    target: int  # which needle the query asks for
    distance: int  # bytes from the target needle's start to the query's value
    answer_spans: tuple[tuple[int, int], ...] = ()  # [start, end) of every queried value, the scored one last

    @property
    def query_start(self) -> int:
        """Where the final query "<MARK>key" begins: everything before it is the haystack with its facts."""
        return self.value_span[0] - 1 - KEY_LENGTH

    def write_mask(self) -> torch.Tensor:
        """The oracle gate: 1 on every needle byte, 0 elsewhere (the query is never written). [T]."""
        mask = torch.zeros(self.input_ids.shape[0])
        for start, end in self.needle_spans:
            mask[start:end] = 1.0
        return mask

    def answer_labels(self) -> torch.Tensor:
        """Labels [T] that score only the queried values (-100 elsewhere, ignored by the loss): MQAR's training
        signal, where every other byte of a haystack is either random or filler."""
        return span_labels(self.input_ids, self.answer_spans)

    def value_accuracy(self, logits: torch.Tensor) -> float:
        """Teacher-forced accuracy on the queried value bytes; logits [T, V] predict the next byte."""
        start, end = self.value_span
        predicted = logits[start - 1:end - 1].argmax(-1)
        return (predicted == self.input_ids[start:end]).float().mean().item()


def random_word(rng: random.Random) -> bytes:
    return bytes(rng.choice(LETTERS) for _ in range(rng.randint(3, 8)))


def filler_bytes(length: int, rng: random.Random, filler_text: bytes | None = None) -> bytes:
    """`length` bytes of space-separated random words, or a random slice of `filler_text`."""
    if filler_text is not None:
        if len(filler_text) < length:
            raise ValueError(f"filler text has {len(filler_text)} bytes; a haystack needs {length}")
        start = rng.randrange(len(filler_text) - length + 1)
        return filler_text[start:start + length].replace(MARKER, b" ")
    out = bytearray()
    while len(out) < length:
        out += random_word(rng) + b" "
    return bytes(out[:length])


def make_needle_example(
    length: int,
    rng: random.Random,
    n_needles: int = 1,
    marker: bool = True,
    filler_text: bytes | None = None,
    n_queries: int = 1,
) -> NeedleExample:
    """A haystack of exactly `length` bytes with `n_needles` facts and a final query for one of them. With
    n_queries > 1 (training: more recalled bytes per window, as in MQAR) other needles are asked first, each
    "<MARK>keyvalue " in full; the last query is the scored one."""
    if not 1 <= n_queries <= n_needles:
        raise ValueError(f"n_queries must be between 1 and n_needles ({n_needles}), got {n_queries}")
    mark = MARKER if marker else b" "
    needle_length = len(mark) + KEY_LENGTH + VALUE_LENGTH  # "<MARK>keyvalue", then a space
    query_length = needle_length + (n_queries - 1) * (needle_length + 1)
    free = length - query_length - n_needles * (needle_length + 1)
    if free < n_needles + 1:
        raise ValueError(f"a haystack of {length} bytes cannot hold {n_needles} needles and {n_queries} queries")
    keys = set()
    while len(keys) < n_needles:  # distinct keys, so every query has one answer
        keys.add(bytes(rng.choice(LETTERS) for _ in range(KEY_LENGTH)))
    facts = [(key, bytes(rng.choice(LETTERS) for _ in range(VALUE_LENGTH))) for key in sorted(keys)]
    rng.shuffle(facts)
    cuts = sorted(rng.randrange(free + 1) for _ in range(n_needles))  # uniform needle positions
    filler = filler_bytes(free, rng, filler_text)
    text, spans, previous = bytearray(), [], 0
    for cut, (key, value) in zip(cuts, facts):
        text += filler[previous:cut]
        spans.append((len(text), len(text) + needle_length))
        text += mark + key + value + b" "
        previous = cut
    text += filler[previous:]
    target = rng.randrange(n_needles)
    answers = []
    for i in rng.sample([i for i in range(n_needles) if i != target], n_queries - 1):  # k = 0 draws nothing
        text += mark + b"".join(facts[i]) + b" "
        answers.append((len(text) - 1 - VALUE_LENGTH, len(text) - 1))
    key, value = facts[target]
    text += mark + key + value
    value_span = (len(text) - VALUE_LENGTH, len(text))
    ids = torch.tensor(list(text), dtype=torch.long) + BYTE_OFFSET
    return NeedleExample(ids, spans, value_span, target, value_span[0] - spans[target][0], (*answers, value_span))
