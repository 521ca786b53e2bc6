"""Multi-query associative recall on bytes (MQAR, the Zoology benchmark: arXiv 2312.04927), issue 19.

    <MARK>keyVALUE <MARK>keyVALUE ... filler ... [<MARK>keyNEWVALUE ...] ... <MARK>key|VALUE <MARK>key|VALUE ...
    \\____ K pairs, distinct keys ___/            \\_ reassigned keys _/    \\___ every key queried once ______/

Keys are `KEY_LENGTH` random lowercase letters after the marker byte, so "<MARK>key" is the 7-byte key window
(`needle.CONTEXT_BYTES`) of the notebooks built for it, as in the needle task (`key_length` shortens them, down to
Zoology's one-token keys: one letter after the marker); values are `value_length`
capitals and digits, an alphabet the filler never uses. In the reassigned variant some keys are written again
after half the filler with a new value; the latest value is the right answer, and the old one is kept (`stale`)
to score against. Every query's value bytes are scored. Everything is drawn from a `random.Random`, so a seed
fixes the example.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import torch

from ..configuration_kathleen import BYTE_OFFSET
from .needle import KEY_LENGTH, LETTERS, MARKER, filler_bytes, span_labels

VALUE_ALPHABET = (string.ascii_uppercase + string.digits).encode()


@dataclass
class MQARExample:
    """One MQAR sequence as token ids, with where its pairs are written and where its answers are scored."""

    input_ids: torch.Tensor  # [T] long
    keys: list[bytes]  # in the order they are queried
    answers: list[bytes]  # the latest value of each queried key
    stale: list[bytes | None]  # a reassigned key's earlier value, else None
    pair_spans: list[tuple[int, int]]  # [start, end) of every written "<MARK>keyvalue", reassignments included
    stale_spans: list[tuple[int, int]]  # the written pairs that a later reassignment overrides
    value_spans: list[tuple[int, int]]  # [start, end) of each query's value: the scored bytes

    @property
    def key_length(self) -> int:
        """Letters per key (every key of an example has as many)."""
        return len(self.keys[0])

    @property
    def first_query(self) -> int:
        """Where the first "<MARK>key" query begins: everything before it is the pairs and the filler."""
        return self.value_spans[0][0] - len(MARKER) - self.key_length

    def write_mask(self) -> torch.Tensor:
        """The oracle gate: 1 on the value bytes of every written pair, 0 elsewhere (a write binds a byte to the 7
        before it, so writing the marker and key bytes too would only spend capacity; queries are never written)."""
        mask = torch.zeros(self.input_ids.shape[0])
        for start, end in self.pair_spans:
            mask[start + len(MARKER) + self.key_length:end - 1] = 1.0
        return mask

    def answer_labels(self) -> torch.Tensor:
        """Labels [T] on the queried values only (-100 elsewhere): Zoology's training signal for MQAR."""
        return span_labels(self.input_ids, self.value_spans)

    def predicted_values(self, logits: torch.Tensor) -> list[list[int]]:
        """Each query's value bytes as teacher-forced greedy reading predicts them: logits [T, V] predict the next
        byte (a special id comes back negative, so it never matches a byte)."""
        return [(logits[start - 1:end - 1].argmax(-1) - BYTE_OFFSET).tolist() for start, end in self.value_spans]

    def value_accuracy(self, logits: torch.Tensor, targets: list[bytes] | None = None) -> float:
        """Teacher-forced accuracy over every queried value byte; logits [T, V] predict the next byte.
        `targets` scores against other values instead (e.g. `stale`, for what an unrefreshed memory says)."""
        right = total = 0
        for predicted, target in zip(self.predicted_values(logits), targets or self.answers):
            if target is None:
                continue
            right += sum(a == b for a, b in zip(predicted, target))
            total += len(target)
        return right / max(total, 1)


def random_value(rng: random.Random, length: int, avoid: bytes | None = None) -> bytes:
    """`length` capitals and digits; differs from `avoid` in its first byte (so a stale answer scores wrong)."""
    while True:
        value = bytes(rng.choice(VALUE_ALPHABET) for _ in range(length))
        if avoid is None or value[0] != avoid[0]:
            return value


def distinct_keys(key_length: int = KEY_LENGTH) -> int:
    """How many different keys of `key_length` letters there are: the most pairs one sequence can hold."""
    return len(LETTERS) ** key_length


def pairs_that_fit(length: int, value_length: int = 2, n_reassigned: int = 0, key_length: int = KEY_LENGTH) -> int:
    """The most pairs a sequence of `length` bytes holds with its reassignments and queries (no filler), at most
    `distinct_keys`."""
    pair_length = len(MARKER) + key_length + value_length + 1
    return min((length + 1 - n_reassigned * pair_length) // (2 * pair_length), distinct_keys(key_length))


def make_mqar_example(length: int, n_pairs: int, rng: random.Random, value_length: int = 2,
                      n_reassigned: int = 0, key_length: int = KEY_LENGTH) -> MQARExample:
    """A sequence of exactly `length` bytes: `n_pairs` key-value pairs, filler, `n_reassigned` of the keys
    written again with new values, more filler, then every key queried once in random order."""
    if not 0 <= n_reassigned <= n_pairs or n_pairs < 1:
        raise ValueError(f"need 1 <= n_pairs and 0 <= n_reassigned <= n_pairs, got {n_pairs} and {n_reassigned}")
    if key_length < 1:
        raise ValueError(f"key_length must be at least 1, got {key_length}")
    if n_pairs > distinct_keys(key_length):
        raise ValueError(f"{n_pairs} pairs need as many distinct keys, and {key_length}-letter keys give only "
                         f"{distinct_keys(key_length)}")
    pair_length = len(MARKER) + key_length + value_length + 1  # "<MARK>keyvalue "
    free = length - (n_pairs + n_reassigned) * pair_length - n_pairs * pair_length + 1  # the last query: no space
    if free < 0:
        raise ValueError(f"a sequence of {length} bytes cannot hold {n_pairs} pairs, {n_reassigned} reassignments "
                         f"and {n_pairs} queries ({length - free} bytes)")
    keys: list[bytes] = []
    seen = set()
    while len(keys) < n_pairs:  # distinct keys, so every query has one answer
        key = bytes(rng.choice(LETTERS) for _ in range(key_length))
        if key not in seen:
            seen.add(key)
            keys.append(key)
    first = {key: random_value(rng, value_length) for key in keys}
    renewed = {key: random_value(rng, value_length, avoid=first[key]) for key in rng.sample(keys, n_reassigned)}
    filler = filler_bytes(free, rng)

    text, pair_spans, written = bytearray(), [], {}

    def write(key: bytes, value: bytes) -> None:
        written[key] = (len(text), len(text) + pair_length)
        pair_spans.append(written[key])
        text.extend(MARKER + key + value + b" ")

    for key in keys:
        write(key, first[key])
    text += filler[:free // 2]
    stale_spans = [written[key] for key in renewed]
    for key, value in renewed.items():
        write(key, value)
    text += filler[free // 2:]
    queried = rng.sample(keys, n_pairs)
    value_spans = []
    for key in queried:
        answer = renewed.get(key, first[key])
        text += MARKER + key
        value_spans.append((len(text), len(text) + value_length))
        text += answer + b" "
    del text[-1]  # no space after the last query
    ids = torch.tensor(list(text), dtype=torch.long) + BYTE_OFFSET
    return MQARExample(ids, queried, [renewed.get(k, first[k]) for k in queried],
                       [first[k] if k in renewed else None for k in queried], pair_spans, stale_spans, value_spans)


def eval_sequences(length: int, n_pairs: int, count: int, seed: int, n_reassigned: int = 0,
                   key_length: int = KEY_LENGTH) -> list[MQARExample]:
    """`count` evaluation sequences, the same for every arm and every script (seeded by the seed, the length and K)."""
    return [make_mqar_example(length, n_pairs, random.Random(f"{seed}-{length}-{n_pairs}-{n_reassigned}-{i}"), 2,
                              n_reassigned, key_length) for i in range(count)]


def value_byte_errors(example: MQARExample, logits: torch.Tensor) -> list[tuple[int, bool, bool]]:
    """Per asked value byte (teacher-forced, logits [T, V] predicting the next byte): (its position in the value,
    right, a wrong guess that is the byte at that position of another key's value). The last flag tells a key
    confused with another written key from a guess that names no pair."""
    rows = []
    for predicted, answer in zip(example.predicted_values(logits), example.answers):
        for i, guess in enumerate(predicted):
            right = guess == answer[i]
            confused = not right and any(value[i] == guess for value in example.answers if value != answer)
            rows.append((i, right, confused))
    return rows


@torch.no_grad()
def recall_after_reading(model, example: MQARExample, unlearn_stale: bool) -> float:
    """Memory-only recall of the latest values when a `NotebookSession` reads everything before the queries with
    the oracle gate, then (if asked) unlearns the stale pairs: an explicit update. Queries write nothing."""
    from ..session import NotebookSession

    queries = example.first_query
    session = NotebookSession(model)
    session.read(example.input_ids[:queries], write_mask=example.write_mask()[:queries],
                 segments=example.pair_spans, progress=False)
    for span in example.stale_spans if unlearn_stale else []:
        session.unlearn(span=span)
    out = model(example.input_ids[None, queries:], cache=session.cache, use_cache=True,
                write_mask=torch.zeros(1, len(example.input_ids) - queries))
    logits = torch.zeros(len(example.input_ids), out.memory_logits.shape[-1])
    logits[queries:] = out.memory_logits[0]
    return example.value_accuracy(logits)


def state_bytes(cache) -> int:
    """Bytes one cache holds: a `KathleenCache`'s state, or a Transformers cache's layers (keys and values, or a
    recurrent model's conv and SSM states), with the notebook adapter's notebook beside its base model's."""
    if hasattr(cache, "state_tensors"):
        return sum(t.numel() * t.element_size() for t in cache.state_tensors().values())
    if hasattr(cache, "base"):  # NotebookAdapterCache
        notebook = cache.notebook
        own = 0 if notebook is None else sum(getattr(notebook, f).numel() * getattr(notebook, f).element_size()
                                             for f in notebook.__dataclass_fields__)
        return own + state_bytes(cache.base)
    total = 0
    for layer in cache.layers:
        for value in vars(layer).values():
            values = value.values() if isinstance(value, dict) else [value]
            total += sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
    return total
