"""scripts/bare_trunk.py: a model without its memory gives exactly the model's trunk logits."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

from conftest import tiny_model
from modeling_kathleen_notebook import KathleenForCausalLM

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bare_trunk", ROOT / "scripts" / "bare_trunk.py")
bare_trunk = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bare_trunk)


def test_the_bare_trunk_is_the_models_trunk():
    """Its logits are the notebook model's trunk logits (control: the model's own logits, with the memory's read,
    differ once the text repeats), and it has no memory weights."""
    model = tiny_model(std=0.3).eval()
    trunk = bare_trunk.bare_trunk(model)
    ids = torch.randint(3, 259, (1, 32)).repeat(1, 3)
    with torch.no_grad():
        out, bare = model(ids), trunk(ids).logits
    torch.testing.assert_close(bare, out.trunk_logits, rtol=0, atol=1e-6)
    assert not torch.allclose(out.logits, out.trunk_logits, atol=1e-3)
    assert trunk.config.memory == "none" and not any("memory" in n for n in trunk.state_dict())


def test_the_command_writes_a_loadable_trunk_and_refuses_a_trunk(tmp_path):
    model = tiny_model(std=0.3)
    model.save_pretrained(tmp_path / "model")
    command = [sys.executable, str(ROOT / "scripts" / "bare_trunk.py")]
    subprocess.run([*command, str(tmp_path / "model"), str(tmp_path / "trunk")], check=True, cwd=ROOT)
    assert KathleenForCausalLM.from_pretrained(tmp_path / "trunk").config.memory == "none"
    again = subprocess.run([*command, str(tmp_path / "trunk"), str(tmp_path / "again")], cwd=ROOT,
                           capture_output=True, text=True)
    assert again.returncode != 0 and "bare trunk already" in again.stderr
    assert not (tmp_path / "again").exists()
