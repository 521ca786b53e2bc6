"""The main job: the shipped checkpoint, the demo, the upload folder and its card."""

import re
import subprocess
import sys
from pathlib import Path

from modeling_kathleen_notebook.demo import DEFAULT_CHECKPOINT

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_checkpoint_is_small_and_carries_a_filled_card():
    size = sum(p.stat().st_size for p in DEFAULT_CHECKPOINT.rglob("*") if p.is_file())
    assert size <= 10 * 2**20, size
    card = (DEFAULT_CHECKPOINT / "README.md").read_text()
    assert "{{" not in card and "library_name: transformers" in card and "64/140,260" in card


def test_demo_runs_and_recalls_above_chance():
    out = subprocess.run([sys.executable, "-m", "modeling_kathleen_notebook.cli", "demo"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    recall = float(re.search(r"recall: (\d+)% of value bytes", out.stdout).group(1)) / 100
    assert recall > 3 / 26, out.stdout  # well above chance (1/26)
    assert "answers identical" in out.stdout
    before, after = map(int, re.search(r"its recall (\d+)% -> (\d+)%", out.stdout).groups())
    assert before > 0 and after < before, out.stdout  # the unlearned fact stops being recalled
    kept = int(re.search(r"the other \d+ facts \d+% -> (\d+)%", out.stdout).group(1))
    assert kept > 100 * 3 / 26, out.stdout  # the others still are, above chance


def test_dry_run_upload_folder_loads_in_a_fresh_process(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "push_to_hub.py"), str(DEFAULT_CHECKPOINT),
                          "kathleen-notebook/test", "--dry-run", "--upload-dir", str(tmp_path / "upload")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loaded offline: KathleenForCausalLM" in out.stdout
    assert (tmp_path / "upload" / "README.md").read_text() == (DEFAULT_CHECKPOINT / "README.md").read_text()


def test_shipped_remote_code_matches_the_package():
    package = ROOT / "modeling_kathleen_notebook"
    copies = sorted(DEFAULT_CHECKPOINT.glob("*.py"))
    assert {p.name for p in copies} >= {"modeling_kathleen.py", "configuration_kathleen.py", "notebook.py"}
    for copy in copies:
        drifted = f"{copy.name} drifted: rerun scripts/ship_checkpoint.py ... --skip-measure"
        assert copy.read_text() == (package / copy.name).read_text(), drifted
