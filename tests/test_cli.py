"""The `kathleen-notebook` command: memory files built and queried across separate calls."""

import json
import subprocess
import sys

from conftest import tiny_model

CLI = [sys.executable, "-m", "modeling_kathleen_notebook.cli"]


def run(*args, cwd):
    result = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_memory_commands_across_calls(tmp_path):
    tiny_model(std=0.3).save_pretrained(tmp_path / "model")
    (tmp_path / "facts.txt").write_text("Ada lives in Paris. Bob lives in Rome. Cy lives in Oslo.\n")
    out = run("memory", "read", "mem.safetensors", "facts.txt", "--model", str(tmp_path / "model"), cwd=tmp_path)
    assert "3 segments" in out
    shown = json.loads(run("memory", "show", "mem.safetensors", cwd=tmp_path).splitlines()[-1])
    assert shown["bytes_read"] == 57 and shown["segments"] == 3 and shown["write_mass"] > 0
    assert len(run("memory", "ask", "mem.safetensors", "Ada lives", "--max-new-tokens", "5", cwd=tmp_path)) > 0
    lines = run("memory", "attribute", "mem.safetensors", "Bob lives in", "--max-new-tokens", "4", cwd=tmp_path)
    assert lines.count("trunk") == 4 and "facts.txt" in lines
    out = run("memory", "unlearn", "mem.safetensors", "Bob lives in Rome.", cwd=tmp_path)
    assert "1 occurrence" in out
    shown = json.loads(run("memory", "show", "mem.safetensors", cwd=tmp_path).splitlines()[-1])
    assert shown["erased_positions"] == len("Bob lives in Rome.")


def test_missing_model_is_a_clear_error(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    result = subprocess.run([*CLI, "memory", "read", "m.safetensors", "a.txt"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode != 0 and "--model" in result.stderr
