"""The needle laboratory end to end on a micro setting: trains four arms, evaluates, writes the report."""

import json
import random
from pathlib import Path

import torch

from modeling_kathleen_notebook.experiments.needle import make_needle_example
from modeling_kathleen_notebook.experiments.needle_lab import distance_bin, run_lab

ROOT = Path(__file__).resolve().parents[1]


def test_query_start_separates_the_haystack_from_the_query():
    example = make_needle_example(256, random.Random(3), n_needles=5)
    query = example.input_ids[example.query_start:]
    target_start = example.needle_spans[example.target][0]
    assert torch.equal(query, example.input_ids[target_start:target_start + len(query)])  # "<MARK>keyvalue"
    assert example.needle_spans[-1][1] <= example.query_start  # every fact lies in the haystack


def test_more_queries_ask_other_needles_and_leave_one_query_as_it_was():
    """n_queries > 1 asks distinct other needles in full before the scored one; n_queries = 1 draws exactly what
    the one-query generator always drew (same seed, same haystack), and too many queries are refused."""
    one = make_needle_example(512, random.Random(5), n_needles=8)
    assert torch.equal(one.input_ids, make_needle_example(512, random.Random(5), n_needles=8, n_queries=1).input_ids)
    many = make_needle_example(512, random.Random(5), n_needles=8, n_queries=4)
    text = bytes((many.input_ids - 3).tolist())
    needles = [text[a:b] for a, b in many.needle_spans]
    asked = text[many.needle_spans[-1][1]:].split(b"\x01")[-4:]  # the last four "<MARK>keyvalue" of the text
    assert len(set(asked)) == 4 and all(b"\x01" + q.strip() in needles for q in asked)
    assert asked[-1] == needles[many.target][1:]  # the scored query is the target
    assert len(many.input_ids) == 512 and many.query_start == 512 - 13
    try:
        make_needle_example(512, random.Random(5), n_needles=2, n_queries=3)
    except ValueError as error:
        assert "n_queries" in str(error)
    else:
        raise AssertionError("three queries of two needles were accepted")


def test_answer_labels_score_only_the_queried_values():
    many = make_needle_example(512, random.Random(6), n_needles=8, n_queries=3)
    labels = many.answer_labels()
    scored = (labels != -100).nonzero().flatten().tolist()
    assert len(scored) == 3 * 6 and many.answer_spans[-1] == many.value_span
    needles = {bytes((many.input_ids[a + 7:a + 13] - 3).tolist()) for a, _ in many.needle_spans}
    for start, end in many.answer_spans:
        assert torch.equal(labels[start:end], many.input_ids[start:end])
        assert bytes((many.input_ids[start:end] - 3).tolist()) in needles  # each answer is a planted value


def test_needle_spec_refuses_impossible_queries_and_unknown_losses():
    from modeling_kathleen_notebook.training.config import NeedleSpec

    assert NeedleSpec(n_needles=4, n_queries=4, loss="answers").loss == "answers"
    for bad, word in (({"n_needles": 2, "n_queries": 3}, "n_queries"), ({"loss": "values"}, "loss")):
        try:
            NeedleSpec(**bad)
        except ValueError as error:
            assert word in str(error)
        else:
            raise AssertionError(f"NeedleSpec({bad}) was accepted")


def test_distance_bins():
    assert [distance_bin(d, 300) for d in (0, 99, 100, 199, 200, 299)] == ["near"] * 2 + ["mid"] * 2 + ["far"] * 2


def test_micro_lab_runs_end_to_end(tmp_path):
    spec = json.loads((ROOT / "configuration" / "experiments" / "needle.json").read_text())
    spec["model"] = {"d_model": 16, "n_layers": 1, "hrr_dim": 256, "gate_embed_dim": 8, "dropout": 0.0}
    spec["settings"]["micro"] = {
        "seeds": {"trunk": [1], "attention": [1], "notebook-oracle": [1], "notebook-learned": [1]},
        "train": {"steps": 4, "batch_size": 2, "min_length": 64, "max_length": 128, "warmup_steps": 1, "lr": 3e-3,
                  "eval_every": 4, "save_every": 4, "eval_windows": 2, "eval_length": 128},
        "eval": {"lengths": [128, 256], "notebook_extra_lengths": [512], "haystacks": 3,
                 "unlearning_lengths": [256], "unlearning_trials": 2},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    results = run_lab(str(tmp_path / "spec.json"), "micro", str(tmp_path / "runs"), str(tmp_path / "needle.md"))
    assert set(results) == {"trunk-seed1", "attention-seed1", "notebook-oracle-seed1", "notebook-learned-seed1"}
    assert 512 in results["notebook-learned-seed1"]["recall"] and 512 not in results["trunk-seed1"]["recall"]
    assert 0.0 <= results["notebook-oracle-seed1"]["unlearning"][256]["retained"] <= 1.0
    report = (tmp_path / "needle.md").read_text()
    assert "| notebook-learned | 1 |" in report and "far bin at 4x" in report  # 4x = 512, a notebook-only length
    assert (tmp_path / "needle.png").stat().st_size > 1000
    # each run's held-out curve, from its metrics.jsonl (evaluated at step 4 of 4), in results.json and the report
    assert [step for step, _, _ in results["trunk-seed1"]["held_out"]] == [4] and results["trunk-seed1"]["steps"] == 4
    assert "## Training: held-out loss" in report and "- trunk, seed 1, 4 steps: " in report


def test_hypotheses_take_their_bounds_from_the_spec():
    """The verdicts follow the spec's "predictions": the same measurement holds against one bound and fails
    against a stricter one, and a spec without a prediction for it gets no verdict."""
    from modeling_kathleen_notebook.experiments.needle_report import (
        Prediction,
        hypothesis_lines,
        setting_predictions,
    )

    results = {"learned": {"arm": "notebook-learned", "seed": 1,
                           "recall": {128: {"full": {"far": 0.95}}, 512: {"full": {"far": 0.85}}}}}
    assert hypothesis_lines(results, 128, {"learned_far_4x": ">= 0.80"}) == [
        "- H1 learned gate, seed 1: far bin at 4x = 0.850 (predicted >= 0.8: held)"]
    assert "failed by 0.050" in hypothesis_lines(results, 128, {"learned_far_4x": ">= 0.90"})[0]
    assert "no arm" in hypothesis_lines(results, 128, {"trunk_far": "< 0.15"})[0]
    # an amendment's setting registers predictions of its own: they apply to that setting's report only
    spec = {"predictions": {"trunk_far": "< 0.15"},
            "settings": {"amended": {"predictions": {"mamba2_far_1x": ">= 0.9"}}, "full": {}}}
    ssm = {"mamba2": {"arm": "mamba2", "seed": 42, "recall": {512: {"full": {"far": 0.5}}}}}
    assert hypothesis_lines(ssm, 512, setting_predictions(spec, "amended")) == [
        "- mamba2, seed 42: far bin 0.500 at 1x (predicted >= 0.9: failed by 0.400)"]
    assert "no arm" in hypothesis_lines(ssm, 512, setting_predictions(spec, "full"))[0]  # control: not registered there
    try:
        Prediction.parse("about 0.9")
    except ValueError as error:
        assert "about" in str(error)
    else:
        raise AssertionError("an unreadable prediction was accepted")
