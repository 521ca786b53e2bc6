"""Synthetic facts planted in real text: for training the notebook to keep what it read, and for measuring it.

    ...real text... Dr. Okafor's badge number is QX7R2M. ...real text...   (the fact, read once)
    Dr. Okafor's badge number is ______                                   (the query restates it; the value is scored)

A fact is a sentence from a template with a name and a value. Templates, names and value alphabets come in
two disjoint parts: `"train"` (what training documents use) and `"held_out"` (what the headline measurements
use: phrasings, names and kinds of value the model never trained on). `test_facts.py` checks that the two
parts share no template, name or alphabet.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..tokenization_kathleen import bytes_to_ids

SPLITS = ("train", "held_out")

# Each template has one {name} and one {value}; the query is the sentence up to {value}.
TEMPLATES = {
    "train": (
        "The code of {name} is {value}.",
        "{name}'s password is {value}.",
        "{name} wrote the word {value} on the board.",
        "The locker of {name} has the number {value}.",
        "Everyone calls {name} by the nickname {value}.",
        "{name} was registered under the tag {value} last year.",
        "In the ledger, {name} is listed as {value}.",
        "The parcel for {name} carries the label {value}.",
        "{name} named the new horse {value}.",
        "The secret word that {name} chose was {value}.",
        "{name} lives on a street called {value}.",
        "The ticket held by {name} reads {value}.",
    ),
    "held_out": (
        "{name}'s badge number is {value}.",
        "According to the archive, {name} used the alias {value}.",
        "The boat owned by {name} is called {value}.",
        "{name} signed every letter with {value} and nothing else.",
        "When asked, {name} gave the answer {value}.",
        "The account of {name} was opened with the id {value}.",
        "{name} keeps a cat named {value}.",
        "Records show that {name} paid with voucher {value}.",
        "The door code for {name} is {value}.",
        "{name} hid the map in a box marked {value}.",
        "A note from {name} said only {value}.",
        "The room booked by {name} is {value} on the top floor.",
    ),
}

# Several pools per part: short invented names and common given names for training; full names and titled
# surnames held out.
NAMES = {
    "train": (
        "Tarn", "Ilse", "Oren", "Maud", "Kest", "Vala", "Brin", "Joss", "Yara", "Quin", "Edda", "Lorn", "Sabe",
        "Pell", "Rhea", "Wynn", "Zeno", "Fenn", "Gale", "Hode", "Ansa", "Cato",
        "Helga", "Tomas", "Greta", "Ivan", "Lucia", "Mateo", "Nadia", "Oskar", "Priya", "Rafael", "Sven", "Tessa",
        "Ulrich", "Vera", "Walter", "Xenia", "Yusuf", "Zelda",
    ),
    "held_out": (
        "Marta Lindqvist", "Kofi Mensah", "Aiko Tanaka", "Lars Eriksen", "Noor Haddad", "Pablo Ortega",
        "Ingrid Solberg", "Chidi Okeke", "Mei Lin", "Dmitri Volkov", "Fatima Zahra", "Henrik Dahl",
        "Dr. Okafor", "Captain Reyes", "Professor Adeyemi", "Mrs. Abernathy", "Sister Benedetta",
        "Judge Halloran", "Colonel Marchetti", "Father Dunleavy", "Lady Ashcombe", "Sergeant Kowalczyk",
    ),
}

WORDS = (  # held-out values of the "word" alphabet: real English words
    "lantern", "harbor", "thistle", "copper", "meadow", "falcon", "granite", "willow", "saddle", "pepper",
    "orchid", "anvil", "barley", "cobalt", "juniper", "marble", "walnut", "compass", "violet", "quarry",
    "pelican", "tundra", "saffron", "beacon", "lagoon", "nutmeg", "cinder", "parsley", "glacier", "hammock",
)


def lowercase_value(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(5, 7)))


def number_value(rng: random.Random) -> str:
    return str(rng.randint(1_000, 9_999_999))


def code_value(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(6))


def word_value(rng: random.Random) -> str:
    return rng.choice(WORDS)


ALPHABETS: dict[str, dict[str, Callable[[random.Random], str]]] = {
    "train": {"lowercase": lowercase_value, "number": number_value},
    "held_out": {"capitals and digits": code_value, "word": word_value},
}


@dataclass(frozen=True)
class Fact:
    """One fact sentence = prompt + value + rest; a query restates the prompt and asks for the value."""

    prompt: str
    value: str
    rest: str
    alphabet: str
    template: str

    @property
    def sentence(self) -> str:
        return f"{self.prompt}{self.value}{self.rest}"

    @property
    def query(self) -> str:
        """What a question restates after a document: a space, then the sentence up to the value."""
        return f" {self.prompt}"


def novel_templates(filler: bytes, n: int, rng: random.Random) -> tuple[str, ...]:
    """n sentence shapes nobody wrote: words drawn at random from `filler` around {name} and {value}. Whatever is
    fitted on them cannot lean on a phrasing (the read trust is; scripts/fit_read_trust.py)."""
    words = re.findall(r"[a-z]{2,12}", filler.decode("utf-8", "ignore"))
    if not words:
        raise ValueError("the filler has no lowercase words to build sentence shapes from")

    def some() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, 4)))

    return tuple(f"{some().capitalize()} {{name}} {some()} {{value}}." if rng.random() < 0.5
                 else f"{{name}} {some()} {{value}}." for _ in range(n))


class FactGenerator:
    """Facts of one part (`"train"` or `"held_out"`): different names and templates within a document;
    `templates` replaces the part's own (the names and value alphabets stay the part's)."""

    def __init__(self, split: str = "held_out", templates: tuple[str, ...] | None = None):
        if split not in SPLITS:
            raise ValueError(f"fact split must be one of {SPLITS}, got {split!r}")
        self.split = split
        self.templates, self.names, self.alphabets = templates or TEMPLATES[split], NAMES[split], ALPHABETS[split]

    def facts(self, n: int, rng: random.Random) -> list[Fact]:
        """n facts about n different people; templates are reused only when n exceeds their number, and
        alphabets take turns from a random start so every document mixes them."""
        if not 1 <= n <= len(self.names):
            raise ValueError(f"the {self.split} part has {len(self.names)} names: ask for 1 to that many facts, "
                             f"not {n}")
        names = rng.sample(self.names, n)
        templates = [self.templates[i % len(self.templates)] for i in rng.sample(range(max(n, len(self.templates))), n)]
        kinds = list(self.alphabets)
        first = rng.randrange(len(kinds))
        facts = []
        for i, (name, template) in enumerate(zip(names, templates)):
            kind = kinds[(first + i) % len(kinds)]
            before, after = template.split("{value}")
            facts.append(Fact(before.format(name=name), self.alphabets[kind](rng), after.format(name=name), kind,
                              template))
        return facts


def plant_facts(filler: bytes, facts: list[Fact], rng: random.Random) -> tuple[bytes, list[tuple[int, int]]]:
    """Insert each fact sentence at a random word boundary of `filler` (anywhere if it has no spaces);
    returns the text and each sentence's [start, end) byte span, in the order of `facts`."""
    boundaries = [i for i, byte in enumerate(filler) if byte == 32] or list(range(len(filler) + 1))
    order = list(range(len(facts)))
    rng.shuffle(order)
    cuts = sorted(rng.choice(boundaries) for _ in facts)
    text, spans, previous = bytearray(), [None] * len(facts), 0
    for cut, i in zip(cuts, order):
        text += filler[previous:cut]
        sentence = f" {facts[i].sentence} ".encode()
        spans[i] = (len(text) + 1, len(text) + len(sentence) - 1)
        text += sentence
        previous = cut
    text += filler[previous:]
    return bytes(text), spans


def planted_length(facts: list[Fact]) -> int:
    """Bytes that planting `facts` adds to a filler (each sentence with a space either side)."""
    return sum(len(f.sentence.encode()) + 2 for f in facts)


def fact_document(
    filler: bytes, length: int, max_facts: int, rng: random.Random, split: str = "train",
    templates: tuple[str, ...] | None = None,
) -> torch.Tensor:
    """A training document of exactly `length` bytes: real text with up to `max_facts` facts planted,
    then every fact stated again in random order (the second mention is what recall makes cheap)."""
    return fact_document_and_values(filler, length, max_facts, rng, split, templates)[0]


def fact_document_and_values(
    filler: bytes, length: int, max_facts: int, rng: random.Random, split: str = "train",
    templates: tuple[str, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fact_document`'s ids [length] and a mask [length] of the value bytes of the restated facts: the bytes
    that only a memory of the first mention can predict."""
    generator = FactGenerator(split, templates)
    n = max(1, min(max_facts, length // 120))  # a fact costs about 80 bytes: once planted, once recalled
    facts = generator.facts(n, rng)
    restated = rng.sample(facts, n)
    queries = (" " + " ".join(f.sentence for f in restated)).encode()
    room = length - len(queries) - planted_length(facts)
    if room < 0:
        raise ValueError(f"a fact document of {length} bytes cannot hold {n} facts")
    text, _ = plant_facts(filler[:room], facts, rng)
    values = torch.zeros(len(text) + len(queries), dtype=torch.bool)
    start = len(text) + 1  # after the space before the first restated sentence
    for fact in restated:
        value = start + len(fact.prompt.encode())
        values[value:value + len(fact.value.encode())] = True
        start += len(fact.sentence.encode()) + 1
    return bytes_to_ids(text + queries), values
