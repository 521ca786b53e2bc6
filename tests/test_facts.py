"""Fact documents: exact lengths, facts stated twice, planted at word boundaries."""

import random

from modeling_kathleen_notebook.facts import NAMES, fact_document, plant_facts, random_facts
from modeling_kathleen_notebook.tokenization_kathleen import ids_to_bytes

FILLER = b"the quick brown fox jumps over the lazy dog and runs away " * 30


def test_fact_documents_have_exact_length_and_repeat_every_fact():
    for length in (128, 300, 512, 777):
        rng = random.Random(length)
        text = ids_to_bytes(fact_document(FILLER, length, 4, rng))
        assert len(text) == length
        sentences = [s for s in text.split(b". ") if b" is " in s]
        values = [s.rsplit(b" is ", 1)[1].strip(b". ") for s in sentences]
        assert values and all(values.count(v) == 2 for v in values)


def test_planting_keeps_words_whole():
    rng = random.Random(0)
    facts = random_facts(3, rng)
    text, spans = plant_facts(FILLER[:400], facts, rng)
    for (start, end), fact in zip(spans, facts):
        assert text[start:end] == fact.sentence.encode()
    restored = text
    for fact in facts:
        restored = restored.replace(f" {fact.sentence} ".encode(), b"", 1)
    assert restored == FILLER[:400]  # inserted between words: no word was split
    assert len({f.name for f in random_facts(20, rng)}) == 20
    assert len({name[-3:] for name in NAMES}) == len(NAMES)  # distinct 7-byte contexts "<abc> is "
