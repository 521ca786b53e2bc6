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


def test_skipped_parts_are_left_out_of_the_measurements(tmp_path):
    """--skip leaves out exactly the parts it names; the stream bits/byte and the reused fact recall stay
    (control: the same run without --skip has every part)."""
    import subprocess
    import sys

    from conftest import tiny_model

    measure = load_measure_checkpoint()
    tiny_model().save_pretrained(tmp_path / "model")
    prose = b"The notebook keeps what it reads, and a reader may ask for it later on. "
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes((prose * (measure.TEST_SPLIT[1] // len(prose) + 1))[:measure.TEST_SPLIT[1]])
    start, end = measure.TEST_SPLIT
    record = tmp_path / "facts.json"
    record.write_text(json.dumps({
        "model": str(tmp_path / "model"), "corpus": f"{corpus}:{start}:{end}", "split": "held_out",
        "facts_per_document": 2, "documents": 1, "seed": 0, "command": "kathleen-notebook facts (a test record)",
        "results": {str(n): {"greedy": 0.5, "first_half": {"greedy": 0.5}, "second_half": {"greedy": 0.5}}
                    for n in measure.LENGTHS}}))

    def measured(*extra: str) -> dict:
        out = tmp_path / f"measured{len(extra)}.json"
        command = [sys.executable, str(ROOT / "scripts" / "measure_checkpoint.py"), str(tmp_path / "model"),
                   "--data", str(corpus), "--bpb-bytes", "3000", "--documents", "1", "--facts", "2",
                   "--haystacks", "1", "--facts-from", str(record), "--out", str(out), *extra]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(out.read_text())

    skipped = measured("--skip", "windows", "needle")
    assert "test_bpb_2048" not in skipped and "needle_recall" not in skipped
    assert skipped["test_bpb"] > 0 and skipped["fact_recall_16384"] == 0.5 and "unlearning" in skipped
    everything = measured()
    assert {"test_bpb_2048", "needle_recall", "unlearning"} <= set(everything)
    assert everything["test_bpb"] == skipped["test_bpb"]
