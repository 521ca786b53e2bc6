"""scripts/generate_peak_memory.py: a generation in a fresh process, its peak memory printed; bad input refused."""

import subprocess
import sys
from pathlib import Path

from conftest import tiny_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "generate_peak_memory.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_prints_the_peak_of_a_generation_and_refuses_an_empty_prompt(tmp_path):
    tiny_model().save_pretrained(tmp_path / "model")
    (tmp_path / "prompt.txt").write_bytes(b"A prompt of a few bytes. " * 20)
    out = run(str(tmp_path / "model"), "--prompt", str(tmp_path / "prompt.txt"), "--prompt-bytes", "300",
              "--new-bytes", "8")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "300-byte prompt + 8 new bytes" in out.stdout and "peak RSS" in out.stdout
    (tmp_path / "empty.txt").write_bytes(b"")  # control: nothing to generate from is an error, not a number
    empty = run(str(tmp_path / "model"), "--prompt", str(tmp_path / "empty.txt"))
    assert empty.returncode != 0 and "empty" in empty.stderr
