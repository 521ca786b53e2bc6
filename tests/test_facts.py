"""Fact generator and fact documents: disjoint training and held-out parts, exact lengths, facts stated twice,
planted at word boundaries."""

import random
import re
import string

import pytest
import torch

from modeling_kathleen_notebook.experiments.facts import (
    ALPHABETS,
    NAMES,
    SPLITS,
    TEMPLATES,
    FactGenerator,
    fact_document,
    novel_templates,
    plant_facts,
)
from modeling_kathleen_notebook.tokenization_kathleen import ids_to_bytes

FILLER = b"the quick brown fox jumps over the lazy dog and runs away " * 60


def template_shape(template: str) -> str:
    """A template's words without punctuation, for comparing phrasings."""
    return " ".join(re.findall(r"[a-z]+", template.lower().replace("{name}", "").replace("{value}", "")))


def values_of(split: str, kind: str, n: int = 400) -> set[str]:
    rng = random.Random(0)
    return {ALPHABETS[split][kind](rng) for _ in range(n)}


def character_class(value: str) -> str:
    """Which alphabet a value is written in."""
    if value.isdigit():
        return "digits"
    if value.islower() and value.isalpha():
        return "lowercase"
    if all(c in string.ascii_uppercase + string.digits for c in value):
        return "capitals and digits"
    return "other"


def test_held_out_part_shares_no_template_name_or_alphabet_with_training():
    train, held = (FactGenerator(split) for split in SPLITS)
    assert len(TEMPLATES["train"]) + len(TEMPLATES["held_out"]) >= 12 and len(set(TEMPLATES["held_out"])) >= 6
    assert not set(TEMPLATES["train"]) & set(TEMPLATES["held_out"])
    assert not {template_shape(t) for t in train.templates} & {template_shape(t) for t in held.templates}
    train_words = {w for name in NAMES["train"] for w in name.split()}
    assert not train_words & {w for name in NAMES["held_out"] for w in name.split()}
    assert not set(ALPHABETS["train"]) & set(ALPHABETS["held_out"])
    train_classes = {character_class(v) for kind in ALPHABETS["train"] for v in values_of("train", kind)}
    for kind in ALPHABETS["held_out"]:
        values = values_of("held_out", kind)
        assert not values & {v for k in ALPHABETS["train"] for v in values_of("train", k)}
        if kind != "word":  # real words are lowercase letters, but no random string of the training part is one
            assert not {character_class(v) for v in values} & train_classes
    # negative control: the check above does see a shared alphabet when there is one
    assert {character_class(v) for v in values_of("train", "lowercase")} & train_classes


@pytest.mark.parametrize("split", SPLITS)
def test_facts_of_a_document_name_different_people_in_different_sentences(split):
    rng = random.Random(1)
    generator = FactGenerator(split)
    for n in (1, 8, len(generator.templates)):
        facts = generator.facts(n, rng)
        assert len({f.prompt for f in facts}) == n
        assert len({f.template for f in facts}) == n and {f.template for f in facts} <= set(TEMPLATES[split])
        assert {f.alphabet for f in facts} <= set(ALPHABETS[split])
        for fact in facts:
            assert fact.sentence.startswith(fact.prompt + fact.value) and fact.query == " " + fact.prompt
    with pytest.raises(ValueError, match="names"):
        generator.facts(len(generator.names) + 1, rng)
    with pytest.raises(ValueError, match="split"):
        FactGenerator("test")


def test_fact_documents_have_exact_length_and_repeat_every_fact():
    for length in (256, 300, 512, 777, 2048):
        rng = random.Random(length)
        text = ids_to_bytes(fact_document(FILLER, length, 4, rng)).decode()
        assert len(text) == length
        planted = [s for s in FactGenerator("train").templates]
        found = [m for t in planted for m in re.findall(re.escape(t.split("{name}")[-1].split("{value}")[0]) + r"(\S+?)"
                                                          + re.escape(t.split("{value}")[1]), text)]
        assert found and all(found.count(v) == 2 for v in found), found


def test_planting_keeps_words_whole_and_reports_spans_in_fact_order():
    rng = random.Random(0)
    facts = FactGenerator("held_out").facts(3, rng)
    text, spans = plant_facts(FILLER[:400], facts, rng)
    for (start, end), fact in zip(spans, facts):
        assert text[start:end] == fact.sentence.encode()
    restored = text
    for fact in facts:
        restored = restored.replace(f" {fact.sentence} ".encode(), b"", 1)
    assert restored == FILLER[:400]  # inserted between words: no word was split


def test_novel_sentence_shapes_are_random_words_and_none_is_held_out():
    """The read trust's fitting facts (facts.novel_templates): one {name} and one {value} each, words of the filler
    around them, never a held-out (or training) template; the training part's names and alphabets stay."""
    rng = random.Random(3)
    shapes = novel_templates(FILLER, 200, rng)
    filler_words = set(re.findall(r"[a-z]{2,12}", FILLER.decode()))
    for shape in shapes:
        assert shape.count("{name}") == 1 and shape.count("{value}") == 1
        assert set(re.findall(r"[a-z]+", shape.replace("{name}", "").replace("{value}", "").lower())) <= filler_words
    assert not set(shapes) & (set(TEMPLATES["held_out"]) | set(TEMPLATES["train"]))
    assert len(set(shapes)) > 150  # shapes, not one shape repeated
    facts = FactGenerator("train", shapes[:8]).facts(8, rng)
    assert {f.template for f in facts} <= set(shapes[:8]) and {f.alphabet for f in facts} <= set(ALPHABETS["train"])
    with pytest.raises(ValueError, match="words"):
        novel_templates(b"1234 5678", 3, rng)


def test_the_value_mask_marks_the_restated_values_and_the_document_is_unchanged():
    """fact_document_and_values marks exactly the restated facts' value bytes; the ids equal fact_document's for the
    same seed (training data does not change)."""
    from modeling_kathleen_notebook.experiments.facts import fact_document, fact_document_and_values
    from modeling_kathleen_notebook.tokenization_kathleen import ids_to_bytes

    filler = b"plain words of real text " * 200
    ids, values = fact_document_and_values(filler, 1024, 4, random.Random(3))
    assert torch.equal(ids, fact_document(filler, 1024, 4, random.Random(3)))
    text = ids_to_bytes(ids)
    marked = [text[i:j] for i, j in zip(*runs(values))]
    assert len(marked) == 4 and all(m and text.count(m) >= 2 for m in marked)  # each value: planted, then restated
    assert all(re.fullmatch(rb"[a-z]{5,7}|[0-9]{4,7}", m) for m in marked)  # a training value, nothing around it
    assert values.sum() == sum(len(m) for m in marked)


def runs(mask):
    """(starts, ends) of the True runs of a 1-D bool tensor."""
    edges = torch.diff(torch.cat([torch.tensor([0]), mask.int(), torch.tensor([0])]))
    return (edges == 1).nonzero().flatten().tolist(), (edges == -1).nonzero().flatten().tolist()
