"""Synthetic fact sentences planted in real text, so that a model learns to write facts and recall them.

    ...real text... The code of Tarn is vkwzpq. ...real text... The code of Tarn is vkwzpq.
                    └ the fact, read once ┘                      └ recalled: the 6 value bytes ┘

A fact is "The <attribute> of <Name> is <value>." with a 6-letter random value; its second mention
comes later in the same document. Used for training (`FactDocuments` in `training.py`) and by the demo.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import torch

from .tokenization_kathleen import bytes_to_ids

# The notebook keys on the 7 bytes before the value, "<last 3 letters of the name> is ", so names must
# differ in their last three letters and one document never names anyone twice.
NAMES = ("Tarn", "Ilse", "Oren", "Maud", "Kest", "Vala", "Brin", "Joss", "Yara", "Quin", "Edda", "Lorn",
         "Sabe", "Nyx", "Pell", "Rhea", "Ulf", "Wynn", "Zeno", "Fenn", "Gale", "Hode", "Ansa", "Cato")
ATTRIBUTES = ("code", "key", "word", "tag", "pin", "mark")
VALUE_LENGTH = 6


@dataclass
class Fact:
    name: str
    attribute: str
    value: str

    @property
    def prompt(self) -> str:
        """The sentence up to the value: what a query asks."""
        return f"The {self.attribute} of {self.name} is "

    @property
    def sentence(self) -> str:
        return f"{self.prompt}{self.value}."


def random_facts(n: int, rng: random.Random) -> list[Fact]:
    """n facts about n different names, with random attributes and random lowercase values."""
    return [Fact(name, rng.choice(ATTRIBUTES), "".join(rng.choice(string.ascii_lowercase) for _ in range(VALUE_LENGTH)))
            for name in rng.sample(NAMES, n)]


def plant_facts(filler: bytes, facts: list[Fact], rng: random.Random) -> tuple[bytes, list[tuple[int, int]]]:
    """Insert each fact sentence at a random word boundary of `filler` (anywhere if it has no spaces);
    returns the text and each sentence's [start, end) byte span."""
    boundaries = [i for i, byte in enumerate(filler) if byte == 32] or list(range(len(filler) + 1))
    cuts = sorted(rng.choice(boundaries) for _ in facts)
    text, spans, previous = bytearray(), [], 0
    for cut, fact in zip(cuts, facts):
        text += filler[previous:cut]
        sentence = f" {fact.sentence} ".encode()
        spans.append((len(text) + 1, len(text) + len(sentence) - 1))
        text += sentence
        previous = cut
    text += filler[previous:]
    return bytes(text), spans


def fact_document(filler: bytes, length: int, max_facts: int, rng: random.Random) -> torch.Tensor:
    """A training document of exactly `length` bytes: real text with up to `max_facts` facts planted,
    then every fact stated again in random order (the second mention is what recall makes cheap)."""
    n = max(1, min(max_facts, length // 90))  # each fact costs about 60 bytes: once planted, once recalled
    facts = random_facts(n, rng)
    queries = (" " + " ".join(f.sentence for f in rng.sample(facts, n))).encode()
    room = length - len(queries) - sum(len(f.sentence) + 2 for f in facts)
    if room < 0:
        raise ValueError(f"a fact document of {length} bytes cannot hold {n} facts")
    text, _ = plant_facts(filler[:room], facts, rng)
    return bytes_to_ids(text + queries)
