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
