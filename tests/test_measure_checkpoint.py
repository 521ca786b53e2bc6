"""measure_checkpoint.py --facts-from takes a `kathleen-notebook facts` record only when it measured the same thing."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_measure_checkpoint():
    spec = importlib.util.spec_from_file_location("measure_checkpoint", ROOT / "scripts" / "measure_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def record(tmp_path):
    """A record as `kathleen-notebook facts MODEL --out FILE` writes it, with the test split's default corpus."""
    measure = load_measure_checkpoint()
    start, end = measure.TEST_SPLIT
    results = {str(length): {"greedy": length / 100_000, "facts": 64} for length in measure.LENGTHS}
    content = {"model": "runs/some-model", "corpus": f"../shared/data/enwiki_excerpt.xml:{start}:{end}",
               "split": "held_out", "facts_per_document": 8, "documents": 8, "seed": 0, "threads": 1,
               "command": "kathleen-notebook facts runs/some-model", "results": results}
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(content))
    return measure, path, content


def test_a_matching_record_is_taken_as_it_stands(record):
    measure, path, content = record
    facts, command = measure.facts_from(str(path), "runs/./some-model", "../shared/data/enwiki_excerpt.xml", 8, 8, 0)
    assert list(facts) == list(measure.LENGTHS)
    assert facts[16384] == content["results"]["16384"]
    assert command == content["command"]  # the card names the command behind the figures it took


@pytest.mark.parametrize("change, named", [
    ({"seed": 1}, "seed"),
    ({"documents": 4}, "documents"),
    ({"split": "train"}, "split"),
    ({"model": "runs/another-model"}, "model"),
    ({"corpus": "../shared/data/enwiki_excerpt.xml:5180771:5480771"}, "corpus"),
])
def test_a_record_of_something_else_is_refused(record, change, named):
    measure, path, content = record
    path.write_text(json.dumps({**content, **change}))
    with pytest.raises(SystemExit, match=f"measured something else: {named}"):
        measure.facts_from(str(path), "runs/some-model", "../shared/data/enwiki_excerpt.xml", 8, 8, 0)


def test_a_record_without_every_length_or_not_a_record_is_refused(record):
    measure, path, content = record
    path.write_text(json.dumps({**content, "results": {"512": {"greedy": 1.0}}}))
    with pytest.raises(SystemExit, match="no length 2048"):
        measure.facts_from(str(path), "runs/some-model", "../shared/data/enwiki_excerpt.xml", 8, 8, 0)
    path.write_text(json.dumps(content)[:100])  # truncated
    with pytest.raises(SystemExit, match="not a `kathleen-notebook facts` record"):
        measure.facts_from(str(path), "runs/some-model", "../shared/data/enwiki_excerpt.xml", 8, 8, 0)


def test_the_trunk_comparison_without_the_repeat_probe(tmp_path):
    """--no-repeat-probe keeps the trunk's bits/byte and leaves the probe out (control: by default it is there)."""
    from conftest import tiny_model

    measure = load_measure_checkpoint()
    model, trunk = tiny_model(std=0.3).eval(), tiny_model(std=0.3, memory="none").eval()
    trunk.save_pretrained(tmp_path / "trunk")
    scored = (b"the notebook reads what it wrote " * 300)[:8192]
    quick = measure.compare_with_trunk(model, str(tmp_path / "trunk"), scored, repeat_probe=False)
    full = measure.compare_with_trunk(model, str(tmp_path / "trunk"), scored)
    assert "repeat_probe" not in quick and set(full["repeat_probe"]) == {"2048", "4096"}
    assert quick["trunk_test_bpb"] == full["trunk_test_bpb"] > 0
