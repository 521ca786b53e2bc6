"""The read trust (read_trust.py) and scripts/fit_read_trust.py: a checkpoint without a trust gets one
initialised, the fit lowers the cross-entropy it is fitted on and is saved with the checkpoint."""

import json
import random
import subprocess
import sys
from pathlib import Path

import torch

from conftest import tiny_model
from modeling_kathleen_notebook import KathleenForCausalLM
from modeling_kathleen_notebook.read_trust import INITIAL_THRESHOLD, INITIAL_WEIGHTS

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the of a river stone house north king music early found large village second written".split()


def test_a_checkpoint_without_a_trust_gets_one_initialised(tmp_path):
    tiny_model(std=0.3, key_binding="bind", write_signal="surprise").save_pretrained(tmp_path)
    plain = KathleenForCausalLM.from_pretrained(tmp_path)
    trusted = KathleenForCausalLM.from_pretrained(tmp_path, read_trust=True)
    assert plain.model.memory.trust is None  # control: only asked for, a trust appears
    assert trusted.model.memory.trust.weights.tolist() == list(INITIAL_WEIGHTS)
    assert trusted.model.memory.trust.threshold.item() == INITIAL_THRESHOLD


def fit(tmp_path, checkpoint, steps: int) -> dict:
    rng = random.Random(0)
    text = tmp_path / "prose.txt"
    text.write_text(" ".join(rng.choice(WORDS) for _ in range(30_000)))
    out = tmp_path / f"fitted-{steps}"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_read_trust.py"), str(checkpoint), str(out),
                    "--data", str(text), "--train-bytes", "0:100000", "--validation-bytes", "100000:160000",
                    "--lengths", "1024", "--documents", "4", "--plain", "1", "--steps", str(steps), "--batch", "512"],
                   check=True, capture_output=True, text=True)
    return out, json.loads((out / "read_trust.json").read_text())


def test_fitting_lowers_the_loss_and_is_saved(tmp_path):
    checkpoint = tmp_path / "model"
    tiny_model(std=0.3, key_binding="bind", write_signal="surprise").save_pretrained(checkpoint)
    out, record = fit(tmp_path, checkpoint, steps=150)
    assert record["bits_per_byte_after"]["fit"] < record["bits_per_byte_before"]["fit"] - 1e-3
    model = KathleenForCausalLM.from_pretrained(out)
    assert model.config.read_trust
    torch.testing.assert_close(model.model.memory.trust.weights, torch.tensor(record["weights"]))
    _, unfitted = fit(tmp_path, checkpoint, steps=0)  # control: the initial, almost silent trust changes ~nothing
    assert abs(unfitted["bits_per_byte_after"]["fit"] - unfitted["bits_per_byte_before"]["fit"]) < 1e-2
    assert record["bits_per_byte_after"]["fit"] < unfitted["bits_per_byte_after"]["fit"] - 1e-3


def test_a_corpus_too_small_is_refused(tmp_path):
    tiny_model().save_pretrained(tmp_path / "model")
    (tmp_path / "small.txt").write_text("a few words only")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_read_trust.py"), str(tmp_path / "model"),
                          str(tmp_path / "out"), "--data", str(tmp_path / "small.txt")], capture_output=True, text=True)
    assert run.returncode != 0 and "--train-bytes holds 16 bytes" in run.stderr
    assert not (tmp_path / "out").exists()


def test_fit_documents_at_every_length_even_past_the_names():
    """The fit's documents: n_facts fact documents and n_plain plain windows at each length, also where a length
    has room for more facts than the training part has names (16 KB: 64 > 40)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fit_read_trust", ROOT / "scripts" / "fit_read_trust.py")
    fit_read_trust = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_read_trust)
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(12_000)).encode()
    texts = fit_read_trust.documents(text, [512, 16384], 2, 1, random.Random(1))
    assert [len(t) for t in texts] == [512] * 3 + [16384] * 3
