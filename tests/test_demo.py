"""The main job: the shipped checkpoint, the demo, the upload folder and its card."""

import re
import subprocess
import sys
from pathlib import Path

from modeling_kathleen_notebook.session import DEFAULT_CHECKPOINT

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_checkpoint_is_small_and_carries_a_filled_card():
    size = sum(p.stat().st_size for p in DEFAULT_CHECKPOINT.rglob("*") if p.is_file())
    # the trunk's weights are 2 MB; the rest are the notebook's stored keys, W x (R/2 + 1) 16-bit residues (8 MB at
    # R = 524,288) and its value frequencies, kept in the file so that the memory is reproducible
    assert size <= 16 * 2**20, size
    card = (DEFAULT_CHECKPOINT / "README.md").read_text()
    assert "{{" not in card and "library_name: transformers" in card and "64/140,260" in card


def run_demo(*args: str) -> tuple[str, float, int, int, int]:
    """The demo's output, its recall, the unlearned fact's recall before / after and the others' after."""
    out = subprocess.run([sys.executable, "-m", "modeling_kathleen_notebook.cli", "demo", *args], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "answers identical" in out.stdout  # the memory saved and reloaded answers the same
    recall = float(re.search(r"recall: (\d+)% of value bytes", out.stdout).group(1)) / 100
    before, after = map(int, re.search(r"its recall (\d+)% -> (\d+)%", out.stdout).groups())
    kept = int(re.search(r"the other \d+ facts \d+% -> (\d+)%", out.stdout).group(1))
    return out.stdout, recall, before, after, kept


def test_demo_with_trained_phrasings_recalls_and_unlearns():
    stdout, recall, before, after, kept = run_demo("--split", "train")
    assert recall > 3 / 26, stdout  # well above chance (1/26)
    assert before > 0 and after < before, stdout  # the unlearned fact stops being recalled
    assert kept > 100 * 3 / 26, stdout  # the others still are, above chance


def facts_recalled(stdout: str) -> tuple[int, int]:
    """Facts the demo answered exactly, and facts it asked."""
    answers = re.findall(r"-> '(.*?)'\s+\(stored '(.*?)'\)", stdout)
    return sum(answer == stored for answer, stored in answers), len(answers)


def test_demo_with_held_out_phrasings_recalls_and_unlearns():
    stdout, recall, before, after, kept = run_demo()
    assert recall >= 0.85, stdout  # chance is 1/26 per byte (measured: 100%)
    assert before == 100 and after <= 10 and kept >= 85, stdout
    right, asked = facts_recalled(stdout)
    assert asked == 8 and right >= 7, stdout  # issue 18's target: 7 of the demo's 8 facts (measured: 8)
    assert facts_recalled("-> 'abc'  (stored 'abd')\n-> 'xy'  (stored 'xy')") == (1, 2)  # control: a wrong byte counts


def test_dry_run_upload_folder_loads_in_a_fresh_process(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "push_to_hub.py"), str(DEFAULT_CHECKPOINT),
                          "kathleen-notebook/test", "--dry-run", "--upload-dir", str(tmp_path / "upload")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loaded offline: KathleenForCausalLM" in out.stdout
    assert (tmp_path / "upload" / "README.md").read_text() == (DEFAULT_CHECKPOINT / "README.md").read_text()


def test_shipped_remote_code_matches_the_package():
    package = ROOT / "modeling_kathleen_notebook"
    copies = sorted([*DEFAULT_CHECKPOINT.glob("*.py"), DEFAULT_CHECKPOINT / "kernels.cpp"])
    assert {p.name for p in copies} >= {"modeling_kathleen.py", "configuration_kathleen.py", "notebook.py"}
    for copy in copies:
        drifted = f"{copy.name} drifted: rerun scripts/ship_checkpoint.py ... --skip-measure"
        assert copy.read_text() == (package / copy.name).read_text(), drifted
