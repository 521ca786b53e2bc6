"""The fact-recall evaluation: documents, read-outs, greedy answers and unlearning, on tiny models whose
memory certainly recalls (everything written, bound keys, a large memory and read scale) or certainly does not."""

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from modeling_kathleen_notebook.experiments.fact_recall import (
    borrows_another_value,
    evaluate_fact_recall,
    make_fact_document,
    score_document,
    unlearning_on_text,
)

ROOT = Path(__file__).resolve().parents[1]
ALICE = ROOT.parent / "shared" / "data" / "canterbury" / "alice29.txt"
if not ALICE.exists():  # the shared corpora sit beside the checkout; a bare clone elsewhere lacks them
    pytest.skip("../shared/data/canterbury/alice29.txt not present", allow_module_level=True)
FILLER = ALICE.read_bytes()


def recalling_model(**overrides):
    """Writes every byte at β ≈ 1 into a large memory with bound keys and reads it loudly: recall of the 7-byte
    contexts seen once, whatever the (untrained) trunk says, up to the crosstalk of some 500 writes in R = 16,384
    (noise σ ≈ 0.18 against a hit of 1)."""
    settings = dict(key_binding="bind", hrr_dim=16384, forgetting=False, gate_bias_init=12.0, read_scale_init=30.0)
    model = tiny_model(**{**settings, **overrides})
    with torch.no_grad():
        model.model.memory.gate.out.weight.zero_()
    return model


def test_documents_have_their_length_and_facts_where_the_spans_say():
    for length in (512, 2048):
        document = make_fact_document(FILLER, length, 4, random.Random(length))
        assert len(document.text) == length
        for fact, (start, end) in zip(document.facts, document.spans):
            assert document.text[start:end] == fact.sentence.encode()
    with pytest.raises(ValueError, match="cannot hold"):
        make_fact_document(FILLER, 200, 8, random.Random(0))


def test_a_memory_that_writes_everything_recalls_and_one_without_memory_does_not():
    document = make_fact_document(FILLER, 512, 3, random.Random(3))
    scores = score_document(recalling_model(), document)
    assert all(len(s["greedy"]) == len(f.value) for s, f in zip(scores, document.facts))
    total = sum(len(f.value) for f in document.facts)
    assert sum(map(sum, (s["memory"] for s in scores))) >= 0.8 * total
    assert sum(map(sum, (s["greedy"] for s in scores))) >= 0.6 * total
    # negative controls: the same model reading nothing back, and a model without memory
    silent = score_document(recalling_model(read_scale_init=0.0), document)
    assert sum(map(sum, (s["greedy"] for s in silent))) <= 0.15 * total
    bare = score_document(tiny_model(memory="none"), document)
    assert "memory" not in bare[0] and sum(map(sum, (s["greedy"] for s in bare))) <= 0.15 * total


def test_summary_splits_by_half_distance_and_alphabet():
    results = evaluate_fact_recall(recalling_model(), FILLER, [384, 512], documents=2, n_facts=2, progress=False)
    for summary in results.values():
        assert summary["facts"] == 4 and summary["first_half"]["facts"] + summary["second_half"]["facts"] == 4
        assert summary["greedy"] >= 0.6 and summary["memory"] >= 0.8
        assert sum(b["facts"] for b in summary["by_distance"].values()) == 4
        assert set(summary["by_alphabet"]) <= {"capitals and digits", "word"}
    again = evaluate_fact_recall(recalling_model(), FILLER, [512], documents=2, n_facts=2, progress=False)
    assert again[512] == results[512]  # the same documents every time


def test_unlearning_a_fact_sentence_erases_it_and_keeps_the_others():
    result = unlearning_on_text(recalling_model(), FILLER, 512, documents=3, n_facts=3)
    assert result["erased_before"] >= 0.6 and result["kept_before"] >= 0.6
    assert result["erased_after"] <= result["erased_trunk_only"] + 0.15
    assert abs(result["kept_after"] - result["kept_before"]) <= 0.15


def test_unlearning_among_facts_of_one_shape_reports_borrowed_values():
    """one_shape documents take one template whose question keeps 4 bytes of the name in the key; an answer that
    matches another fact's value on half its bytes or more counts as borrowed."""
    from modeling_kathleen_notebook.experiments.facts import Fact

    other = Fact("The door code for Ada is ", "QX7RZ9", ".", "capitals and digits", "")
    assert borrows_another_value("QX7aaa", [other]) and not borrows_another_value("QXaaaa", [other])
    model = recalling_model(key_window=16, repeat_key_window=4)
    for clear in (True, False):
        result = unlearning_on_text(model, FILLER, 512, documents=2, n_facts=3, one_shape=True,
                                    clear_shared_keys=clear)
        assert result["erased_before"] >= 0.6 and result["erased_after"] <= result["erased_trunk_only"] + 0.15
        assert 0.0 <= result["erased_borrowed_after"] <= 1.0 and result["kept_after"] >= 0.6
    with pytest.raises(ValueError, match="4 bytes of the name"):  # 7-byte keys reach no held-out name
        unlearning_on_text(recalling_model(), FILLER, 512, documents=1, n_facts=3, one_shape=True)


def test_facts_command_refuses_a_missing_corpus_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "modeling_kathleen_notebook.cli", "facts", str(tmp_path),
                          "--corpus", str(tmp_path / "nothing.txt")], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--corpus" in out.stderr and "Traceback" not in out.stderr
