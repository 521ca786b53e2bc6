"""Exact bits/byte: the streaming scorer, the evaluate metric, lm-eval and the plain HF protocol agree."""

import math
import shutil
from pathlib import Path

import evaluate
import pytest
import torch

from conftest import run_fresh_python, tiny_model
from modeling_kathleen_notebook.configuration_kathleen import EOS_ID
from modeling_kathleen_notebook.scoring import bits_per_byte, byte_bits, stream_log_probs
from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Colourless green ideas sleep furiously; the quick brown fox jumps over the lazy dog.\n" * 12


def one_forward_bits(model, ids):
    with torch.no_grad():
        sequence = torch.cat([torch.tensor([EOS_ID]), ids]).unsqueeze(0)
        loss = model(sequence, labels=sequence, use_cache=False).loss
    return loss.item() / math.log(2)


@pytest.mark.parametrize("memory", ["notebook", "attention", "none"])
def test_stream_equals_one_forward_for_any_chunk(memory):
    model = tiny_model(memory=memory, std=0.1)
    ids = bytes_to_ids(TEXT.encode())
    expected = one_forward_bits(model, ids)
    for chunk in (1000, 257, 64, 7):
        assert abs(bits_per_byte(model, ids, chunk_size=chunk) - expected) <= 1e-5


def test_windows_reset_the_state():
    model = tiny_model(std=0.1)
    ids = bytes_to_ids(TEXT.encode())
    bits = byte_bits(model, ids, window=100, chunk_size=33)
    # window 2 alone, from an empty state, with the byte before it as its only context
    second = -stream_log_probs(model, ids[99:199].unsqueeze(0), ids[100:200].unsqueeze(0))[0] / math.log(2)
    torch.testing.assert_close(bits[100:200], second, rtol=0, atol=1e-5)
    # the bytes after the last full window: in the 100-byte window that ends with the text (lm-eval's last window)
    n, full = len(ids), len(ids) // 100 * 100
    assert n > full
    last = -stream_log_probs(model, ids[n - 101:n - 1].unsqueeze(0), ids[n - 100:].unsqueeze(0))[0] / math.log(2)
    torch.testing.assert_close(bits[full:], last[full - (n - 100):], rtol=0, atol=1e-5)
    alone = -stream_log_probs(model, ids[full - 1:n - 1].unsqueeze(0), ids[full:].unsqueeze(0))[0] / math.log(2)
    assert (bits[full:] - alone).abs().max() > 1e-3  # control: with one byte of context they differ
    with pytest.raises(ValueError, match="empty"):
        byte_bits(model, ids[:0])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    model = tiny_model(std=0.1)
    model.save_pretrained(folder)
    return folder, model


@pytest.mark.parametrize("window", [None, 100])
def test_evaluate_metric_module_matches(saved, window):
    folder, model = saved
    metric = evaluate.load(str(ROOT / "scripts" / "bits_per_byte"))
    result = metric.compute(predictions=[TEXT, TEXT[:300]], model_id=str(folder), window=window, chunk_size=64)
    ids = [bytes_to_ids(t.encode()) for t in (TEXT, TEXT[:300])]
    expected = sum(byte_bits(model, i, window).sum().item() for i in ids) / sum(len(i) for i in ids)
    assert abs(result["bits_per_byte"] - expected) <= 1e-5
    assert abs(result["byte_perplexity"] - 2 ** expected) <= 1e-3


def test_sizes_below_one_and_empty_texts_are_refused_before_scoring(saved):
    """A window or chunk of 0 bytes was a ZeroDivisionError or "range() arg 3 must not be zero"; the metric on no
    texts divided by zero. Now each names the argument, the metric before it loads a model (a missing folder would
    say otherwise). Control: the same calls with sizes of 1 score."""
    folder, model = saved
    ids = bytes_to_ids(b"some text")
    for bad in (0, -2):
        with pytest.raises(ValueError, match="window is the bytes of each independent window"):
            byte_bits(model, ids, window=bad)
        with pytest.raises(ValueError, match="chunk_size is the bytes fed per forward call"):
            byte_bits(model, ids, chunk_size=bad)
    assert byte_bits(model, ids, window=1, chunk_size=1).shape == (len(ids),)
    metric = evaluate.load(str(ROOT / "scripts" / "bits_per_byte"))
    for predictions, sizes in (([], {}), (["text", ""], {}), (["text"], {"window": 0}), (["text"], {"chunk_size": 0})):
        with pytest.raises(ValueError, match="non-empty texts|byte counts of at least 1"):
            metric.compute(predictions=predictions, model_id="no/such-model", **sizes)
    assert metric.compute(predictions=["text"], model_id=str(folder), window=1, chunk_size=1)["bits_per_byte"] > 0


def test_evaluate_metric_runs_without_the_package(saved, tmp_path):
    """Where only the checkpoint's remote code exists (the package blocked from import in a fresh process), the
    metric loads and scores. Control: the same process cannot import the package."""
    folder, model = saved
    code = f"""
import sys
sys.modules["modeling_kathleen_notebook"] = None  # as if it were not installed
import evaluate
metric = evaluate.load({str(ROOT / "scripts" / "bits_per_byte")!r})
print(metric.compute(predictions=[{TEXT[:200]!r}], model_id={str(folder)!r})["bits_per_byte"])
try:
    import modeling_kathleen_notebook
except ImportError:
    print("package blocked")
"""
    out = run_fresh_python(code, cwd=tmp_path).split()
    assert out[-2:] == ["package", "blocked"]
    assert abs(float(out[-3]) - byte_bits(model, bytes_to_ids(TEXT[:200].encode())).mean().item()) <= 1e-5


def test_lm_eval_rolling_loglikelihood_matches(saved, tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder, model = saved
    monkeypatch.chdir(tmp_path)
    Path("kathleen_eval_text.txt").write_text(TEXT)
    results = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={folder},trust_remote_code=True,max_length=128", tasks=["kathleen_text"],
        task_manager=TaskManager(include_path=str(ROOT / "configuration" / "lm_eval")), device="cpu", batch_size=2,
    )["results"]["kathleen_text"]
    ours = bits_per_byte(model, bytes_to_ids(TEXT.encode()), window=128)
    assert abs(results["bits_per_byte,none"] - ours) <= 1e-5


def test_standard_hf_protocol_by_hub_id_without_remote_code(saved, tmp_path):
    folder, model = saved
    repo = tmp_path / "home" / "hub" / "models--kathleen--tiny"
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    code = f"""
import math, torch
import modeling_kathleen_notebook  # registers the Auto classes: no trust_remote_code below
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("kathleen/tiny").eval()
tokenizer = AutoTokenizer.from_pretrained("kathleen/tiny")
ids = torch.tensor([[tokenizer.eos_token_id] + tokenizer({TEXT!r})["input_ids"]])
with torch.no_grad():
    print(model(ids, labels=ids).loss.item() / math.log(2))
"""
    stdout = run_fresh_python(code, cwd=tmp_path, HF_HOME=str(tmp_path / "home"))
    ours = bits_per_byte(model, bytes_to_ids(TEXT.encode()))
    assert abs(float(stdout.strip().splitlines()[-1]) - ours) <= 1e-5


def test_eval_bpb_command(saved, tmp_path):
    import subprocess
    import sys

    folder, model = saved
    (tmp_path / "t.txt").write_text(TEXT)
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "eval_bpb.py"), str(folder), str(tmp_path / "t.txt"),
                          "--byte-range", "10", "500", "--chunk-size", "100"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    expected = bits_per_byte(model, bytes_to_ids(TEXT.encode()[10:500]))
    assert f"{expected:.4f} bits/byte over 490 bytes" in out.stdout


def test_eval_bpb_by_position_splits_one_stream_into_growing_ranges(saved, tmp_path):
    """--by-position: bits/byte of the stream's positions 0-512, 512-2,048, ..., the model's and its trunk's alone,
    the same numbers as byte_bits gives; refused with --window (windows restart the state)."""
    import subprocess
    import sys

    from modeling_kathleen_notebook.cli import position_ranges

    assert position_ranges(100) == [(0, 100)] and position_ranges(512) == [(0, 512)]
    assert position_ranges(3000) == [(0, 512), (512, 2048), (2048, 3000)]
    folder, model = saved
    text = (TEXT * 3).encode()  # 2,556 bytes: three ranges, the last one short
    (tmp_path / "t.txt").write_bytes(text)
    command = [sys.executable, str(ROOT / "scripts" / "eval_bpb.py"), str(folder), str(tmp_path / "t.txt")]
    out = subprocess.run([*command, "--by-position"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    bits, trunk = byte_bits(model, bytes_to_ids(text), readout=("logits", "trunk_logits"))
    for lo, hi in position_ranges(len(text)):
        assert (f"bytes {lo:,}-{hi:,}: {bits[lo:hi].mean():.4f}, its trunk alone {trunk[lo:hi].mean():.4f}"
                in out.stdout), out.stdout
    assert not torch.allclose(bits, trunk)  # control: the two readouts differ, so the line shows both
    refused = subprocess.run([*command, "--by-position", "--window", "64"], capture_output=True, text=True)
    assert refused.returncode != 0 and "leave out --window" in refused.stderr


def test_trunk_readout_scores_the_trunk_logits_of_the_same_forward():
    model = tiny_model(std=0.1)
    ids = bytes_to_ids(TEXT.encode())
    sequence = torch.cat([torch.tensor([EOS_ID]), ids]).unsqueeze(0)
    with torch.no_grad():
        out = model(sequence, use_cache=False)
    for readout in ("logits", "trunk_logits"):
        expected = -torch.log_softmax(getattr(out, readout)[0, :-1], -1).gather(-1, ids[:, None])[:, 0] / math.log(2)
        got = byte_bits(model, ids, chunk_size=100, readout=readout)
        assert torch.allclose(got, expected, atol=1e-4)
    # control: the notebook's read changes the bits, so the two readouts differ
    assert not torch.allclose(byte_bits(model, ids, readout="trunk_logits"), byte_bits(model, ids), atol=1e-3)


def test_several_readouts_from_one_pass_equal_each_alone():
    model = tiny_model(std=0.1)
    ids = bytes_to_ids(TEXT.encode())
    for window in (None, 64):  # the stream, and windows with a right-aligned last one
        both = byte_bits(model, ids, window=window, chunk_size=50, readout=("logits", "trunk_logits"))
        assert both.shape == (2, len(ids))
        for row, readout in zip(both, ("logits", "trunk_logits")):
            assert torch.allclose(row, byte_bits(model, ids, window=window, chunk_size=50, readout=readout), atol=1e-5)
        assert not torch.allclose(both[0], both[1], atol=1e-3)  # control: the rows are different readouts
