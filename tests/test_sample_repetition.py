"""scripts/sample_repetition.py: the copied share of sampled bytes, and the script end to end on a tiny model."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sample_repetition", ROOT / "scripts" / "sample_repetition.py")
sample_repetition = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sample_repetition)


def test_a_text_that_repeats_itself_is_all_copied_and_new_bytes_are_not():
    prompt = bytes(range(40, 80))
    # the prompt said again: all but the 3 bytes whose 4-gram spans the join were seen
    assert sample_repetition.copied_share(prompt + prompt[:20], 40, 4) == pytest.approx(17 / 20)
    assert sample_repetition.copied_share(prompt + bytes(range(100, 120)), 40, 4) == 0.0  # the control
    # an n-gram that straddles the prompt's end counts once it was seen: "abcd" then "abcd" again, n = 2
    assert sample_repetition.copied_share(b"xyabcd" + b"abcd", 6, 2) == pytest.approx(3 / 4)
    with pytest.raises(ValueError, match="start"):
        sample_repetition.copied_share(b"abc", 3, 2)


def test_the_script_compares_models_with_the_text_and_refuses_bad_input(tmp_path):
    tiny_model(std=0.3).save_pretrained(tmp_path / "model")
    text = tmp_path / "text.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 40)
    run = [sys.executable, str(ROOT / "scripts" / "sample_repetition.py"), str(tmp_path / "model"), "--data",
           str(text), "--byte-range", "0", "1800", "--prompts", "2", "--prompt-bytes", "200", "--new-bytes", "16",
           "--out", str(tmp_path / "out")]
    done = subprocess.run(run, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    shares = json.loads((tmp_path / "out.json").read_text())["shares"]
    assert shares["text itself"] == [1.0, 1.0]  # a text that only repeats itself
    assert len(shares[str(tmp_path / "model")]) == 2
    bad = subprocess.run(run[:-2] + ["--n", "0"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--n" in bad.stderr and "Traceback" not in bad.stderr
    short = subprocess.run(run[:5] + ["--byte-range", "0", "100"], capture_output=True, text=True)
    assert short.returncode != 0 and "need" in short.stderr and "Traceback" not in short.stderr
