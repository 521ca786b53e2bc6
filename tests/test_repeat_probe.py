"""The repeat probe's word classes and its per-class bits."""

import json
import math
import subprocess
import sys
from pathlib import Path

import torch

from conftest import tiny_model
from modeling_kathleen_notebook.experiments.repeat_probe import (
    FIRST,
    NEAR,
    OTHER,
    REPEAT,
    classify_bytes,
    exact_context_reach,
    probe,
)


def test_classes_and_distances():
    text = b"alpha beta gamma " + b"x" * 3 + b" " * 60 + b"alpha gamma gamma"
    kind, distance = classify_bytes(text, window=len(text))
    assert kind[0:5].tolist() == [FIRST] * 5 and kind[5] == OTHER
    assert kind[6:10].tolist() == [FIRST] * 4  # "beta": 4 letters is a word
    first_alpha, second_alpha = 0, text.rindex(b"alpha")
    assert kind[second_alpha] == REPEAT and distance[second_alpha] == second_alpha - first_alpha
    last_gamma = text.rindex(b"gamma")
    assert kind[last_gamma] == NEAR  # 6 bytes after the previous "gamma": too close to count
    kind, _ = classify_bytes(text, window=20)  # windows reset what has been seen
    assert kind[second_alpha] == FIRST


def test_exact_context_reach_needs_the_whole_key_window_and_stays_in_its_window():
    data = b"xyz hello abc hello help"
    second = data.index(b"hello", 5)
    stored, rivals = exact_context_reach(data, window=64, key_window=2)
    assert stored[second + 1:second + 5].all() and not stored[second]  # "ello" follows " h", "he", "el", "ll" again
    assert not rivals[second + 1:second + 5].any()
    assert rivals[len(data) - 1] and not stored[len(data) - 1]  # "el" was followed by "l" before, never by "p"
    both, rivals = exact_context_reach(b"axaybax", window=64, key_window=1)
    assert both[6] and rivals[6]  # "a" was followed by "x" and by "y": the read returns both
    longer, _ = exact_context_reach(data, window=64, key_window=4)
    assert longer[second + 3:second + 5].all() and not longer[second + 1:second + 3].any()  # control: "bc h" is new
    cut, _ = exact_context_reach(data, window=second, key_window=2)  # the repeat opens a new, empty window
    assert not cut[second:second + 5].any()


def test_probe_reports_every_class():
    model = tiny_model(std=0.1)
    text = (b"The Kathleen notebook remembers words. Repetition helps the notebook remember. " * 20)[:1500]
    result = probe(model, text, window=512, with_gate=True)
    assert result["repeat_bytes"] > 0 and result["first_bytes"] > 0
    assert 0 < result["beta_repeat"] < 1 and 0 < result["beta_other"] < 1
    assert result["repeat_bytes_64-256"] + result["repeat_bytes_256-1024"] + result["repeat_bytes_1024-inf"] \
        == result["repeat_bytes"]
    assert abs(result["bpb"] - probe(model, text, window=512, with_gate=False)["bpb"]) < 1e-9
    assert torch.isfinite(torch.tensor(result["bpb_first"]))
    assert torch.isfinite(torch.tensor(result["bpb_first_trunk_readout"]))
    assert result["bpb_first_trunk_readout"] != result["bpb_first"]  # the read moves first mentions too
    quick = probe(model, text, window=512, with_gate=True, betas=False)  # the same numbers without the β pass
    assert "beta_repeat" not in quick and set(quick) == {k for k in result if not k.startswith("beta_")}
    assert all(quick[k] == result[k] or (quick[k] != quick[k] and result[k] != result[k]) for k in quick)  # NaN bins


def test_probe_does_not_depend_on_how_many_windows_are_scored_at_once():
    model = tiny_model(std=0.1)
    text = (b"Windows are scored in batches; each one starts from an empty memory. " * 30)[:2100]
    batched, one_by_one = (probe(model, text, window=256, with_gate=True, batch_size=size) for size in (16, 1))
    assert batched.keys() == one_by_one.keys()
    for key, value in batched.items():
        both_empty = math.isnan(value) and math.isnan(one_by_one[key])  # a distance bin longer than the window
        assert both_empty or math.isclose(value, one_by_one[key], abs_tol=1e-5), key
    # negative control: a different window length changes the numbers, so the comparison can fail
    assert abs(probe(model, text, window=512, with_gate=True, batch_size=1)["bpb"] - batched["bpb"]) > 1e-5


def test_key_reach_script_writes_its_table_and_refuses_a_missing_file(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "key_reach.py"
    text = tmp_path / "text.txt"
    text.write_bytes(b"the notebook remembers words; the notebook remembers them again later on. " * 8)
    out = tmp_path / "reach"
    base = [sys.executable, str(script), "--file", str(text), "--byte-range", "0", "600", "--window", "300"]
    done = subprocess.run([*base, "--key-windows", "4", "16", "--fact-lengths", "512", "--documents", "2",
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.with_suffix(".json").read_text())
    repeats, facts = result["repeats"], result["facts"]
    assert repeats["4"]["repeats"]["stored"] >= repeats["16"]["repeats"]["stored"] > 0  # a shorter key reaches more
    first = "their first bytes at 512"
    assert facts["16"][first]["stored"] == 1.0  # a fact's sentence is in its document: its key was written
    assert facts["16"][first]["clean"] >= facts["4"][first]["clean"]  # and a longer key collides less
    assert "| 16 |" in out.with_suffix(".md").read_text()
    missing = subprocess.run([*base[:3], str(tmp_path / "none.txt")], capture_output=True, text=True)
    assert missing.returncode != 0 and "no file" in missing.stderr  # control: a bad path is an error, not a table
