"""Memories on the Hub: a session's memory as a repository (file + card), loaded back by repo id through a local
Hub cache in a fresh offline process, by the API and by `kathleen-notebook memory pull`."""

import json
import os
import shutil
import subprocess
import sys

from conftest import run_fresh_python, tiny_model
from modeling_kathleen_notebook.session import NotebookSession

TEXT = "Ada keeps the key QX7. Bo keeps the key ZR2. The rest is ordinary prose about nothing.\n"


def cache_repo(home, repo_id: str, folder) -> None:
    """Put a folder where huggingface_hub's cache keeps a downloaded model repository."""
    repo = home / "hub" / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


def test_memory_round_trips_through_the_hub_cache(tmp_path):
    home = tmp_path / "hf_home"
    tiny_model(std=0.3).save_pretrained(tmp_path / "model")
    cache_repo(home, "kathleen/tiny", tmp_path / "model")
    # the memory records the Hub id (this process imported huggingface_hub already: cache and offline by argument)
    session = NotebookSession.from_pretrained("kathleen/tiny", cache_dir=str(home / "hub"), local_files_only=True)
    session.read(TEXT, source="keys.txt")
    session.save_to_folder(str(tmp_path / "memory"))
    card = (tmp_path / "memory" / "README.md").read_text()
    assert "`kathleen/tiny`" in card and f"{len(TEXT):,} bytes" in card and "`keys.txt`" in card
    cache_repo(home, "kathleen/keys-memory", tmp_path / "memory")
    expected = session.ask("Ada keeps the key ", max_new_tokens=6).tolist()

    code = """
import json
from modeling_kathleen_notebook.session import NotebookSession
session = NotebookSession.from_hub("kathleen/keys-memory")
print(json.dumps([session.ask("Ada keeps the key ", max_new_tokens=6).tolist(), session.summary()]))
"""
    answer, summary = json.loads(run_fresh_python(code, cwd=tmp_path, HF_HOME=str(home)).splitlines()[-1])
    assert answer == expected and summary == session.summary()

    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    cli = [sys.executable, "-m", "modeling_kathleen_notebook.cli", "memory"]
    pulled = subprocess.run([*cli, "pull", "mem.safetensors", "kathleen/keys-memory"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert json.loads(pulled.stdout.splitlines()[-1]) == session.summary()
    reloaded = NotebookSession.from_pretrained(str(tmp_path / "model"))
    reloaded.load(str(tmp_path / "mem.safetensors"))
    assert reloaded.ask("Ada keeps the key ", max_new_tokens=6).tolist() == expected
    missing = subprocess.run([*cli, "pull", "m2.safetensors", "kathleen/no-such-memory"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)  # control: not cached, offline
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert not (tmp_path / "m2.safetensors").exists()
