"""The model card template: every placeholder is filled or the generator refuses."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from modeling_kathleen_notebook import KathleenForCausalLM

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("make_model_card", ROOT / "scripts" / "make_model_card.py")
make_model_card = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_model_card)


def test_unfilled_placeholders_are_refused():
    template = (ROOT / "model_cards" / "template.md").read_text()
    names = set(re.findall(r"\{\{(\w+)\}\}", template))
    assert {"test_bpb", "fact_recall_2048", "needle_recall", "parameters"} <= names
    with pytest.raises(SystemExit, match="test_bpb"):
        make_model_card.fill(template, {name: "x" for name in names - {"test_bpb"}})
    card = make_model_card.fill(template, {name: "x" for name in names})
    assert "{{" not in card and card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-generation")
    assert "64/140,260" in card  # the patent notice of SPEC's references


def test_save_pretrained_writes_a_minimal_card_and_keeps_a_measured_one(tmp_path):
    from conftest import tiny_model

    model = tiny_model()
    model.save_pretrained(tmp_path / "new")
    card = (tmp_path / "new" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers") and "{" + "{" not in card
    assert f"{sum(p.numel() for p in model.parameters()):,}" in card and "trust_remote_code=True" in card
    (tmp_path / "new" / "README.md").write_text("a measured card")
    model.save_pretrained(tmp_path / "new")  # saving again: the card stays the one that was there
    assert (tmp_path / "new" / "README.md").read_text() == "a measured card"


def test_a_model_resized_after_its_trust_was_fitted_names_every_step():
    """resize -> fit the trust -> resize again: the card names the first resize, the fit and the later step in
    that order. Control: a checkpoint with its own read_trust.json (fitted last) has no later step."""
    first, fit, again = ("python scripts/resize_memory.py a b --hrr-dim 8", "python scripts/fit_read_trust.py b c",
                         "python scripts/resize_memory.py c d --hrr-dim 8 --key-window 16")
    resize = {"command": again, "earlier_commands": [first, fit]}
    assert make_model_card.after_training(resize, None) == (first, [], fit, [again])
    assert make_model_card.after_training({"command": first}, fit) == (first, [], fit, [])
    assert make_model_card.after_training({}, None) == ("(not resized)", [], None, [])
    refit = "python scripts/fit_read_trust.py d e"  # fitted again after the second resize: both steps between
    assert make_model_card.after_training(resize, refit) == (first, [fit, again], refit, [])


def test_the_card_says_whether_the_notebook_was_attached_to_a_trunk_trained_alone():
    attached = make_model_card.memory_sentence({"attached_to_bare_trunk": True}, "resize a b")
    resized = make_model_card.memory_sentence({"command": "resize a b"}, "resize a b")
    assert "`resize a b`" in attached and "no notebook weight trained with them" in attached
    assert "nothing trained depends on R" in resized and "no notebook weight" not in resized  # the control


def test_a_model_resized_after_its_trust_was_fitted_keeps_the_fit_s_numbers(tmp_path):
    """The card's "8 numbers" (crosstalk cap fitted) comes from the fit's record: read_trust.json where the trust
    was fitted last, else the copy resize.json keeps. Control: a model with no fit has no record."""
    fit = {"command": "python scripts/fit_read_trust.py b c --noise-cap", "noise_cap": 0.05}
    assert make_model_card.read_trust_fit(tmp_path, {}) == ({}, None)
    resized = {"command": "resize c d", "earlier_commands": [fit["command"]], "read_trust": fit}
    assert make_model_card.read_trust_fit(tmp_path, resized) == (fit, None)
    (tmp_path / "read_trust.json").write_text(json.dumps(fit))
    assert make_model_card.read_trust_fit(tmp_path, {"command": "resize a b"}) == (fit, fit["command"])


@pytest.mark.parametrize("repeat_key_window, own_trust", [(4, False), (4, True), (0, False)])
def test_the_card_names_a_repeat_bank_and_its_fitted_read_scale(tmp_path, repeat_key_window, own_trust):
    """A checkpoint with a repeat bank whose read scale was fitted with the trust says so in its card, and names
    the bank's own trust where it has one; without a bank (the control) the card says nothing of a repeat bank."""
    import subprocess
    import sys

    from conftest import tiny_model

    model = tiny_model(key_binding="bind", write_signal="surprise", read_trust=True, key_window=16,
                       repeat_key_window=repeat_key_window, repeat_read_trust=own_trust)
    model.save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "read_trust.json").write_text(json.dumps(
        {"command": "python scripts/fit_read_trust.py a b --noise-cap", "noise_cap": 0.1,
         "repeat_read_scale": 1.25 if repeat_key_window else None}))
    names = set(re.findall(r"\{\{(\w+)\}\}", (ROOT / "model_cards" / "template.md").read_text()))
    computed = {"repeat_bank", "read_trust_sentence", "between_sentence", "key_window", "read_scale", "bpb_bytes",
                "key_limitation"}
    (tmp_path / "results.json").write_text(json.dumps({name: "x" for name in names - computed}))
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_model_card.py"), str(tmp_path / "model"),
                    "--results", str(tmp_path / "results.json")], check=True, capture_output=True, text=True)
    card = (tmp_path / "model" / "README.md").read_text()
    scale = float(KathleenForCausalLM.from_pretrained(tmp_path / "model").model.memory.repeat_read_scale) \
        if repeat_key_window else None
    if repeat_key_window:
        own = ", its read through a read trust of its own" if own_trust else ""
        assert f"a repeat bank of the same R keyed by the newest 4 bytes (read scale {scale:.2f}{own})" in card
        assert f"({16 if own_trust else 8} numbers and the repeat bank's read scale," in card
        assert "another fact's value through the short key" in card and "re-keys it" not in card
    else:
        assert "repeat bank" not in card and "(8 numbers, everything else frozen" in card
        assert "--key-window 7` re-keys it" in card  # the long key's limitation, without a short key to help
