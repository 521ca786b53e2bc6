"""Training data: a corpus as token ids, and step batches that are a pure function of (seed, step).

A step's window length is uniform in [min_length, max_length] (the upper end rising from min_length over the first
length_warmup_steps steps, a curriculum) and every window start is drawn from a generator
seeded with (seed, step), so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import torch

from ..configuration_kathleen import EOS_ID
from ..tokenization_kathleen import bytes_to_ids, ids_to_bytes
from .config import DataSpec, FactMixing, MQARSpec, NeedleSpec, TrainSettings


def load_corpus(spec: DataSpec) -> torch.Tensor:
    """Token ids of a corpus through `datasets`, each document preceded by the separator (eos).

    byte_range [start, end) selects bytes of the concatenated documents (for one file: its offsets).
    """
    from datasets import load_dataset

    if spec.files is not None:
        extra = {"sample_by": "document"} if spec.format == "text" else {}
        dataset = load_dataset(spec.format, data_files=list(spec.files), split="train", **extra)
    else:
        dataset = load_dataset(spec.dataset, spec.name, split=spec.split)
    start, end = spec.byte_range or [0, None]
    pieces, offset = [], 0
    for document in dataset[spec.column]:
        data = document.encode("utf-8")
        lo, hi = max(start - offset, 0), len(data) if end is None else min(end - offset, len(data))
        if lo < hi:
            pieces.append(torch.tensor([EOS_ID]))
            pieces.append(bytes_to_ids(data[lo:hi]))
        offset += len(data)
    if not pieces:
        raise ValueError(f"the corpus {spec} is empty after byte_range selection")
    return torch.cat(pieces)


class StepBatches(torch.utils.data.Dataset):
    """Sample i of a run belongs to step i // batch_size; its length and content depend on (seed, i) only,
    so a run resumed at any step sees exactly the batches an uninterrupted one would."""

    def __init__(self, train: TrainSettings, first_step: int = 0):
        self.train, self.first_step = train, first_step

    def __len__(self) -> int:
        return (self.train.steps - self.first_step) * self.train.batch_size

    def longest_of_step(self, step: int) -> int:
        """The largest length step `step` may draw: max_length, or less during the length curriculum."""
        shortest, longest, warmup = self.train.min_length, self.train.max_length, self.train.length_warmup_steps
        return longest if step >= warmup else shortest + (longest - shortest) * step // warmup

    def length_of_step(self, step: int) -> int:
        g = torch.Generator().manual_seed(self.train.seed * 1_000_003 + step)
        return int(torch.randint(self.train.min_length, self.longest_of_step(step) + 1, (1,), generator=g))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = self.first_step * self.train.batch_size + index
        return self.make(sample, self.length_of_step(sample // self.train.batch_size))

    def make(self, sample: int, length: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class TextWindows(StepBatches):
    """Windows of a corpus at starts drawn from (seed, sample)."""

    def __init__(self, corpus: torch.Tensor, train: TrainSettings, first_step: int = 0):
        super().__init__(train, first_step)
        self.corpus = corpus
        if len(corpus) <= train.max_length + 1:
            raise ValueError(f"the training corpus has {len(corpus)} tokens; windows need {train.max_length + 1}")

    def make(self, sample: int, length: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.train.seed * 7_919 + sample)
        start = int(torch.randint(0, len(self.corpus) - length, (1,), generator=g))
        return {"input_ids": self.corpus[start:start + length]}


class TextWithFacts(TextWindows):
    """Corpus windows; a fraction of them become fact documents (real text with synthetic facts planted
    and stated again), so the notebook learns to write a fact once and recall it later."""

    def __init__(self, corpus: torch.Tensor, facts: FactMixing, train: TrainSettings, first_step: int = 0):
        super().__init__(corpus, train, first_step)
        self.facts = facts

    def make(self, sample: int, length: int) -> dict[str, torch.Tensor]:
        from ..experiments.facts import fact_document

        window = super().make(sample, length)
        rng = random.Random(self.train.seed * 31_337 + sample)
        if rng.random() >= self.facts.probability:
            return window
        return {"input_ids": fact_document(ids_to_bytes(window["input_ids"]), length, self.facts.max_facts, rng)}


class TaskExamples(StepBatches):
    """Examples of a synthetic recall task of the step's length, drawn from (seed, sample), with their oracle write
    masks, and with loss "answers" labels on the asked values only."""

    def __init__(self, spec: NeedleSpec | MQARSpec, train: TrainSettings, first_step: int = 0):
        super().__init__(train, first_step)
        self.spec = spec
        self.make(0, train.min_length)  # the shortest example must hold the task: fail now, not at that step

    def make(self, sample: int, length: int) -> dict[str, torch.Tensor]:
        example = self.example(length, random.Random(self.train.seed * 7_919 + sample))
        batch = {"input_ids": example.input_ids, "write_mask": example.write_mask()}
        return batch | ({"labels": example.answer_labels()} if self.spec.loss == "answers" else {})

    def example(self, length: int, rng: random.Random):
        raise NotImplementedError


class NeedleHaystacks(TaskExamples):
    """Needle haystacks (SPEC §6.1)."""

    def __init__(self, spec: NeedleSpec, train: TrainSettings, first_step: int = 0):
        self.filler = Path(spec.filler_file).read_bytes() if spec.filler_file else None
        super().__init__(spec, train, first_step)

    def example(self, length: int, rng: random.Random):
        from ..experiments.needle import make_needle_example

        return make_needle_example(length, rng, self.spec.n_needles, self.spec.marker, self.filler,
                                   self.spec.n_queries)


class MQARSequences(TaskExamples):
    """MQAR sequences (experiments/mqar.py, issue 19)."""

    def example(self, length: int, rng: random.Random):
        from ..experiments.mqar import make_mqar_example, pairs_that_fit

        spec, n_pairs = self.spec, self.spec.n_pairs
        if spec.max_pairs is not None:  # a mixture of K, as Zoology trains: at least n_pairs, at most what fits
            fit = pairs_that_fit(length, spec.value_length, spec.n_reassigned, spec.key_length)
            n_pairs = max(n_pairs, min(rng.randint(n_pairs, spec.max_pairs), fit))
        return make_mqar_example(length, n_pairs, rng, spec.value_length, spec.n_reassigned, spec.key_length)


def task_examples(data: DataSpec, train: TrainSettings, first_step: int = 0) -> TaskExamples:
    """The synthetic task a data spec names (needle or mqar)."""
    kind = NeedleHaystacks if data.needle is not None else MQARSequences
    return kind(data.task, train, first_step)


class TextStreams(StepBatches):
    """Row r of step s reads window s mod K of stream (s div K, r), K = stream_windows: consecutive stretches of
    one long text whose state the training loop carries from step to step. A stream is a corpus stretch as long
    as its K windows together, or (with probability facts.probability) a fact document of that length whose
    questions come at its very end, so the answers lie up to a whole stream after the facts."""

    def __init__(self, corpus: torch.Tensor, facts: FactMixing | None, train: TrainSettings, first_step: int = 0):
        super().__init__(train, first_step)
        self.corpus, self.windows = corpus, train.stream_windows
        self.facts = facts or FactMixing(probability=0.0)
        self._stream_key, self._stream = None, None
        if len(corpus) <= self.windows * train.max_length + 1:
            raise ValueError(f"the training corpus has {len(corpus)} tokens; streams need "
                             f"{self.windows * train.max_length + 1}")

    def make(self, sample: int, length: int) -> dict[str, torch.Tensor]:
        step, row = divmod(sample, self.train.batch_size)
        first = step - step % self.windows  # the stream's first step
        offset = sum(self.length_of_step(s) for s in range(first, step))
        return {"input_ids": self.stream(first, row)[offset:offset + length]}

    def stream(self, first: int, row: int) -> torch.Tensor:
        """The whole text of stream (first step, row), built once and kept while its windows are asked for."""
        if self._stream_key != (first, row):
            from ..experiments.facts import fact_document
            from ..tokenization_kathleen import ids_to_bytes

            total = sum(self.length_of_step(s) for s in range(first, first + self.windows))
            rng = random.Random(self.train.seed * 7_919 + first * 1_000_003 + row)
            start = rng.randrange(0, len(self.corpus) - total)
            text = self.corpus[start:start + total]
            if rng.random() < self.facts.probability:
                text = fact_document(ids_to_bytes(text), total, self.facts.max_facts, rng)
            self._stream_key, self._stream = (first, row), text
        return self._stream


def training_batches(data: DataSpec, train: TrainSettings, first_step: int = 0) -> StepBatches:
    """The training data of a run, from its first step on."""
    if data.task is not None:
        return task_examples(data, train, first_step)
    if train.stream_windows > 1:
        return TextStreams(load_corpus(data), data.facts, train, first_step)
    if data.facts is not None:
        return TextWithFacts(load_corpus(data), data.facts, train, first_step)
    return TextWindows(load_corpus(data), train, first_step)


def held_out_batches(data: DataSpec, train: TrainSettings) -> list[dict[str, torch.Tensor]]:
    """Fixed evaluation batches: evenly spaced corpus windows, or task examples (needle, MQAR) from their own seed."""
    n, length = train.eval_windows, train.eval_length
    if data.task is not None:
        source = task_examples(data, dataclasses.replace(train, seed=train.seed + 10_000))
        examples = [source.make(i, length) for i in range(n)]
    else:
        corpus = load_corpus(data)
        length = min(length, len(corpus))
        starts = torch.linspace(0, len(corpus) - length, n).long().unique().tolist()
        examples = [{"input_ids": corpus[s:s + length]} for s in starts]
    return [torch.utils.data.default_collate(examples[i:i + 16]) for i in range(0, len(examples), 16)]
