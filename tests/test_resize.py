"""scripts/resize_memory.py: a trained model moved to another R keeps every trained weight, draws its codebooks
anew from the seed, and comes back to the same logits when moved back."""

import importlib.util
from pathlib import Path

import pytest
import torch

from conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("resize_memory", ROOT / "scripts" / "resize_memory.py")
resize_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(resize_memory)


@pytest.mark.parametrize("binding", ["bundle", "bind"])
def test_resizing_keeps_weights_and_round_trips(binding):
    model = tiny_model(std=0.3, key_binding=binding, write_signal="surprise", hrr_dim=256)
    bigger = resize_memory.resized(model, 1024)
    assert bigger.config.hrr_dim == 1024
    params = dict(model.named_parameters())
    for name, weight in bigger.named_parameters():
        assert torch.equal(weight, params[name]), name
    assert all(b.shape[-1] in (1024, 513) for name, b in bigger.named_buffers() if "memory" in name)
    ids = torch.randint(3, 259, (1, 40))
    with torch.no_grad():
        before, wide, back = (m(ids).logits for m in (model, bigger, resize_memory.resized(bigger, 256)))
    torch.testing.assert_close(back, before, rtol=0, atol=1e-5)
    assert (wide - before).abs().max() > 1e-3  # negative control: another R is another memory


def test_forgetting_switch_and_the_calibration_grid():
    """resized(..., forgetting=True) keeps the weights and forgets (another memory: other logits after a long
    input); the candidate grid starts with the trained setting and holds every combination once."""
    import argparse

    model = tiny_model(std=0.3, key_binding="bind", write_signal="surprise", hrr_dim=256, forgetting=False)
    forgetting = resize_memory.resized(model, 256, forgetting=True)
    assert forgetting.config.forgetting and not model.config.forgetting
    ids = torch.randint(3, 259, (1, 200))
    with torch.no_grad():
        assert torch.equal(resize_memory.resized(model, 256)(ids).logits, model(ids).logits)
        assert (forgetting(ids).logits - model(ids).logits).abs().max() > 1e-4
    args = argparse.Namespace(scales="4,8", shifts="0,1", surprise_scales="1", forget_logits="-5")
    memory = forgetting.model.memory
    grid = resize_memory.candidates(memory, args, uses_surprise=True, forgetting=True)
    trained = {k: float(getattr(memory, k).detach()) for k in resize_memory.KNOBS}
    assert grid[0] == trained and len(grid) == 3 * 2 * 2 * 2
    assert len({tuple(sorted(s.items())) for s in grid}) == len(grid)
