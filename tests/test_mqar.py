"""MQAR on bytes (issue 19): the generator's guarantees, and the notebook's exact recall with an oracle gate,
including the reassigned-keys variant with an explicit update (unlearn the old value, keep the new)."""

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from modeling_kathleen_notebook.configuration_kathleen import BYTE_OFFSET, KathleenConfig
from modeling_kathleen_notebook.experiments.mqar import (
    eval_sequences,
    make_mqar_example,
    pairs_that_fit,
    recall_after_reading,
    state_bytes,
    value_byte_errors,
)
from modeling_kathleen_notebook.experiments.needle import CONTEXT_BYTES, KEY_LENGTH, MARKER
from modeling_kathleen_notebook.modeling_kathleen import KathleenForCausalLM
from modeling_kathleen_notebook.training.config import MQARSpec, TrainingConfig, TrainSettings
from modeling_kathleen_notebook.training.data import MQARSequences


def text_of(example) -> bytes:
    return bytes((example.input_ids - BYTE_OFFSET).tolist())


def oracle_logits(example, values) -> torch.Tensor:
    """Logits that predict exactly `values` at each query's value bytes (and nothing elsewhere)."""
    logits = torch.zeros(len(example.input_ids), 259)
    for (start, _), value in zip(example.value_spans, values):
        for i, byte in enumerate(value):
            logits[start - 1 + i, byte + BYTE_OFFSET] = 1.0
    return logits


@pytest.mark.parametrize("length, n_pairs, n_reassigned, key_length", [
    (256, 4, 0, KEY_LENGTH), (4096, 64, 0, KEY_LENGTH), (16384, 256, 0, KEY_LENGTH), (2048, 32, 8, KEY_LENGTH),
    (256, 8, 0, 1), (1024, 26, 4, 1), (2048, 64, 8, 3)])
def test_keys_unique_queries_cover_the_pairs_and_the_length_is_exact(length, n_pairs, n_reassigned, key_length):
    example = make_mqar_example(length, n_pairs, random.Random(length), n_reassigned=n_reassigned,
                                key_length=key_length)
    text = text_of(example)
    assert len(text) == length
    assert len(set(example.keys)) == n_pairs and {len(k) for k in example.keys} == {key_length}
    assert len(example.pair_spans) == n_pairs + n_reassigned and len(example.stale_spans) == n_reassigned
    written = {text[a + 1:a + 1 + key_length] for a, _ in example.pair_spans}
    assert written == set(example.keys)  # the queries cover exactly the written keys
    for key, answer, (start, end) in zip(example.keys, example.answers, example.value_spans):
        assert text[start - key_length - 1:start] == MARKER + key and text[start:end] == answer
    assert text.count(MARKER) == 2 * n_pairs + n_reassigned  # the filler never holds the marker
    assert text[example.first_query:example.first_query + 1 + key_length] == MARKER + example.keys[0]
    marked = example.write_mask().nonzero().flatten().tolist()  # the oracle gate: exactly the written values
    assert marked == [i for a, b in example.pair_spans for i in range(a + 1 + key_length, b - 1)]
    again = make_mqar_example(length, n_pairs, random.Random(length), n_reassigned=n_reassigned, key_length=key_length)
    assert again.keys == example.keys


def test_a_key_length_sets_how_many_pairs_fit_and_more_than_its_distinct_keys_are_refused():
    assert pairs_that_fit(1024) == 1025 // (2 * (1 + KEY_LENGTH + 2 + 1))
    assert pairs_that_fit(1024, key_length=3) == 1025 // (2 * 7)
    assert pairs_that_fit(1024, key_length=1) == 26  # room for 102, but only 26 one-letter keys
    with pytest.raises(ValueError, match="distinct keys"):
        make_mqar_example(1024, 27, random.Random(0), key_length=1)
    with pytest.raises(ValueError, match="at least 1"):
        make_mqar_example(1024, 4, random.Random(0), key_length=0)
    with pytest.raises(ValueError, match="key_length"):
        MQARSpec(n_pairs=27, key_length=1)
    with pytest.raises(ValueError, match="key_length"):
        MQARSpec(key_length=0)
    spec = MQARSpec(n_pairs=1, max_pairs=64, key_length=1)  # K drawn up to 64, held to the 26 keys there are
    sequences = MQARSequences(spec, TrainSettings(steps=1, batch_size=8, min_length=1024, max_length=1024))
    drawn = [bytes((sequences[i]["input_ids"] - BYTE_OFFSET).tolist()).count(MARKER) // 2 for i in range(16)]
    assert max(drawn) == 26 and min(drawn) < 26  # control: a mixture of K, not always the cap


def test_reassigned_keys_score_the_latest_value():
    example = make_mqar_example(2048, 16, random.Random(0), n_reassigned=6)
    text = text_of(example)
    stale = [(answer, old) for answer, old in zip(example.answers, example.stale) if old is not None]
    assert len(stale) == 6 and all(answer != old for answer, old in stale)
    overridden = {key: old for key, old in zip(example.keys, example.stale) if old is not None}
    assert len(example.stale_spans) == len(overridden)
    for a, b in example.stale_spans:  # each overridden pair holds its key's stale value
        assert text[a + 1 + KEY_LENGTH:b - 1] == overridden[text[a + 1:a + 1 + KEY_LENGTH]]
    last = {}
    for a, b in example.pair_spans:  # the latest write of each key is the answer
        last[text[a + 1:a + 1 + KEY_LENGTH]] = text[a + 1 + KEY_LENGTH:b - 1]
    assert [last[k] for k in example.keys] == example.answers
    assert example.value_accuracy(oracle_logits(example, example.answers)) == 1.0
    stale_answers = [old or answer for answer, old in zip(example.answers, example.stale)]
    assert example.value_accuracy(oracle_logits(example, stale_answers)) < 1.0  # control: old values score wrong
    assert example.value_accuracy(oracle_logits(example, example.answers), targets=example.stale) == 0.0


def test_value_byte_errors_tell_a_confused_key_from_a_guess_that_names_no_pair():
    example = make_mqar_example(1024, 8, random.Random(3))
    assert all(right and not other for _, right, other in value_byte_errors(example, oracle_logits(example,
                                                                                                  example.answers)))
    swapped = example.answers[1:] + example.answers[:1]  # every key answered with another key's value
    rows = value_byte_errors(example, oracle_logits(example, swapped))
    assert [position for position, _, _ in rows] == [0, 1] * 8
    assert all(other for _, right, other in rows if not right) and sum(not right for _, right, _ in rows) >= 8
    unwritten = [b"!!"] * 8  # control: bytes no value has are wrong, and name no pair
    assert all(not right and not other for _, right, other in value_byte_errors(example, oracle_logits(example,
                                                                                                      unwritten)))


def test_eval_sequences_are_the_same_for_every_caller_and_differ_by_seed():
    first, again = eval_sequences(512, 4, 2, seed=0), eval_sequences(512, 4, 2, seed=0)
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(first, again))
    assert not torch.equal(first[0].input_ids, first[1].input_ids)
    assert not torch.equal(first[0].input_ids, eval_sequences(512, 4, 1, seed=1)[0].input_ids)  # control


def test_too_short_a_sequence_is_refused():
    with pytest.raises(ValueError, match="cannot hold"):
        make_mqar_example(100, 16, random.Random(0))
    with pytest.raises(ValueError, match="n_reassigned"):
        make_mqar_example(1024, 4, random.Random(0), n_reassigned=5)


@pytest.fixture(scope="module")
def notebook_model():
    torch.manual_seed(0)
    # bound keys: bundled ones share the marker byte's role vector, and their crosstalk ends capacity far sooner
    return KathleenForCausalLM(KathleenConfig(forgetting=False, d_model=32, n_layers=1, key_binding="bind",
                                              hrr_dim=4096, key_window=CONTEXT_BYTES)).eval()


def test_untrained_notebook_recalls_every_pair_with_an_oracle_gate(notebook_model):
    example = make_mqar_example(2048, 16, random.Random(1))
    with torch.no_grad():
        out = notebook_model(example.input_ids[None], write_mask=example.write_mask()[None], use_cache=False)
    assert example.value_accuracy(out.memory_logits[0]) >= 0.95
    with torch.no_grad():  # control: nothing written, nothing recalled
        empty = notebook_model(example.input_ids[None], write_mask=torch.zeros(1, len(example.input_ids)),
                               use_cache=False)
    assert example.value_accuracy(empty.memory_logits[0]) <= 0.2
    crowded = make_mqar_example(8192, 256, random.Random(1))  # past this memory's capacity, recall falls
    with torch.no_grad():
        out = notebook_model(crowded.input_ids[None], write_mask=crowded.write_mask()[None], use_cache=False)
    assert crowded.value_accuracy(out.memory_logits[0]) < 0.9


def test_an_explicit_update_answers_the_latest_value(notebook_model):
    example = make_mqar_example(2048, 16, random.Random(2), n_reassigned=8)
    updated = recall_after_reading(notebook_model, example, unlearn_stale=True)
    superposed = recall_after_reading(notebook_model, example, unlearn_stale=False)
    assert updated >= 0.95
    assert superposed < updated - 0.1  # control: old and new values share a key and compete


ROOT = Path(__file__).resolve().parents[1]


def test_every_arm_of_the_mqar_spec_builds_trains_a_step_and_holds_the_state_it_claims():
    """The pre-registered arms (configuration/experiments/mqar.json) load as training configs, take a training step
    on MQAR, and the Mamba2 arms hold about the state of the notebook arm they are matched with."""
    spec = json.loads((ROOT / "configuration" / "experiments" / "mqar.json").read_text())
    batch = torch.utils.data.default_collate(
        [MQARSequences(MQARSpec(**spec["task"]), TrainSettings(steps=1, batch_size=2, min_length=256,
                                                               max_length=256))[i] for i in range(2)])
    states = {}
    for name, arm in spec["arms"].items():
        config = TrainingConfig.from_dict({"model": arm, "data": {"train": {"mqar": spec["task"]},
                                                                  "eval": {"mqar": spec["task"]}},
                                           "train": spec["train"], "output_dir": "unused"})
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config.model_config())
        loss = model(batch["input_ids"], labels=batch["labels"]).loss
        loss.backward()
        assert 3.0 < loss.item() < 9.0, name  # untrained: near ln(259) = 5.56, wherever its init puts it
        assert sum(p.grad.abs().sum() for p in model.parameters() if p.grad is not None) > 0, name
        with torch.no_grad():
            states[name] = state_bytes(model.eval()(batch["input_ids"][:1]).cache)
    for R, mamba2 in ((1024, "mamba2-s2"), (2048, "mamba2-s4"), (4096, "mamba2-s10")):
        assert abs(states[mamba2] / states[f"notebook-R{R}"] - 1) < 0.1, (R, states)
    assert states["llama"] > 10 * states["notebook-R4096"]  # control: a KV cache is not a matched state


def test_the_mqar_lab_trains_evaluates_and_reports(tmp_path):
    tiny = {"d_model": 16, "n_layers": 1, "hrr_dim": 256, "key_window": 7, "write_signal": "gate",
            "gate_embed_dim": 4}
    spec = json.loads((ROOT / "configuration" / "experiments" / "mqar.json").read_text())
    spec["arms"] = {"notebook": tiny, "llama": {"base_config": {
        "model_type": "llama", "vocab_size": 259, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2}, "notebook_config": {"memory": "none"}}}
    spec["train"].update(steps=4, batch_size=2, min_length=128, max_length=128, max_minutes=1, time_schedule=False,
                         eval_every=4, save_every=4, eval_windows=2, eval_length=128)
    spec["eval"] = {"seed": 0, "examples": 1, "capacity_length": 256, "pairs": [4, 8, 16, 64], "lengths": [128, 256],
                    "length_pairs": 4, "reassigned": {"length": 256, "pairs": 4, "reassigned": 2}}
    spec["train_per_arm"] = {"llama": {"length_warmup_steps": 2}}  # an arm's own settings over the spec's
    spec["task_per_arm"] = {"llama": {"key_length": 1}}  # and its own task: one-letter keys
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    command = [sys.executable, str(ROOT / "scripts" / "mqar_lab.py"), "--spec", str(tmp_path / "spec.json"),
               "--out", str(tmp_path / "runs"), "--report", str(tmp_path / "mqar")]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "mqar.json").read_text())
    assert set(rows) == {"notebook", "llama"}
    assert set(rows["notebook"]["capacity"]) == {"4", "8"}  # 16 or 64 pairs do not fit in 256 bytes: left out
    assert set(rows["llama"]["capacity"]) == {"4", "8", "16"}  # with one-letter keys 16 fit
    assert rows["llama"]["key_length"] == 1 and rows["notebook"]["key_length"] == 6
    assert "latest_after_update" in rows["notebook"]["reassigned"]
    assert "latest_after_update" not in rows["llama"]["reassigned"]  # no notebook, no explicit update
    assert all(0.0 <= v <= 1.0 for row in rows.values() for v in [*row["capacity"].values(), *row["length"].values()])
    written = {arm: json.loads((tmp_path / "runs" / f"{arm}.json").read_text())["train"] for arm in rows}
    assert written["llama"]["length_warmup_steps"] == 2 and "length_warmup_steps" not in written["notebook"]
    tasks = {arm: json.loads((tmp_path / "runs" / f"{arm}.json").read_text())["data"]["train"]["mqar"] for arm in rows}
    assert tasks["llama"]["key_length"] == 1 and "key_length" not in tasks["notebook"]
    report = (tmp_path / "mqar.md").read_text()
    assert f"Pre-registered spec: `{tmp_path / 'spec.json'}`" in report  # the spec it ran, not mqar.json
    assert "| notebook |" in report and "| llama |" in report and (tmp_path / "mqar.png").stat().st_size > 0
    assert "## Discussion" not in report  # control for the hand-written part below
    (tmp_path / "mqar_discussion.md").write_text("What the runs say.\n")
    again = subprocess.run([*command, "--report-only"], capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0 and json.loads((tmp_path / "mqar.json").read_text()) == rows  # nothing retrained
    assert "## Discussion\n\nWhat the runs say." in (tmp_path / "mqar.md").read_text()  # kept across rewrites
    trained = (tmp_path / "mqar.md").read_text().split("Runs trained and evaluated by: ")[1].split(". Report")[0]
    assert "mqar_lab.py" in trained and "--report-only" not in trained  # the command that made the runs, kept
    errors = subprocess.run([sys.executable, str(ROOT / "scripts" / "mqar_errors.py"), str(tmp_path / "runs" / "llama"),
                             "--length", "256", "--pairs", "4", "--examples", "1"], capture_output=True, text=True)
    assert errors.returncode == 0, errors.stderr[-2000:]
    assert "llama: value byte 1: accuracy" in errors.stdout and "llama: value byte 2: accuracy" in errors.stdout
    assert "1-letter keys" in errors.stdout  # the run's own task (task_per_arm above)
    asked = subprocess.run([*errors.args, "--key-length", "3"], capture_output=True, text=True)
    assert asked.returncode == 0 and "3-letter keys" in asked.stdout  # asked on keys it never trained on
    for bad, says in (("0", "at least 1"), ("1 --pairs 30", "distinct keys")):  # control: refused, clearly
        refused = subprocess.run([*errors.args, "--key-length", *bad.split()], capture_output=True, text=True)
        assert refused.returncode != 0 and says in refused.stderr and "Traceback" not in refused.stderr
    (tmp_path / "runs" / "llama" / "config.json").unlink()  # a model folder that names no task
    unnamed = subprocess.run(errors.args, capture_output=True, text=True)
    assert unnamed.returncode != 0 and "--key-length" in unnamed.stderr and "Traceback" not in unnamed.stderr
    assert subprocess.run([*errors.args, "--key-length", "1"], capture_output=True, text=True).returncode == 0
    missing = subprocess.run([sys.executable, str(ROOT / "scripts" / "mqar_errors.py"), str(tmp_path / "runs")],
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "not a saved model" in missing.stderr  # a folder without `final`
    shutil.rmtree(tmp_path / "runs" / "llama")  # a run folder gone (a new machine): its row stays in the report
    kept = subprocess.run([*command, "--report-only"], capture_output=True, text=True, cwd=tmp_path)
    assert kept.returncode == 0 and json.loads((tmp_path / "mqar.json").read_text()) == rows
    assert "| llama |" in (tmp_path / "mqar.md").read_text()
    (tmp_path / "mqar.json").unlink()  # control: with neither the run nor the report's row, the arm is gone
    dropped = subprocess.run([*command, "--report-only"], capture_output=True, text=True, cwd=tmp_path)
    assert dropped.returncode == 0 and set(json.loads((tmp_path / "mqar.json").read_text())) == {"notebook"}


def test_the_mamba2_arms_chunk_size_is_only_the_scans_block_size():
    """The spec's amendment (Mamba2 chunk_size 256 -> 32, for speed on a CPU) leaves the model's function alone:
    Transformers' chunked scan gives the same logits at either block size, on a length that neither divides."""
    spec = json.loads((ROOT / "configuration" / "experiments" / "mqar.json").read_text())
    base = dict(spec["arms"]["mamba2-s4"]["base_config"])
    model_type = base.pop("model_type")
    assert base["chunk_size"] == 32
    ids = torch.randint(BYTE_OFFSET, 259, (2, 300))
    logits = {}
    for chunk_size in (base["chunk_size"], 256):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**base, "chunk_size": chunk_size}))
        model.eval()
        with torch.no_grad():
            logits[chunk_size] = model(ids).logits
            model.backbone.layers[0].mixer.A_log.add_(0.5)  # control: a real change to the model shows
            changed = model(ids).logits
    torch.testing.assert_close(logits[32], logits[256], atol=1e-4, rtol=1e-4)
    assert (changed - logits[256]).abs().max() > 1e-2
