"""Shared fixtures: one intra-op thread (SPEC §8: two threads under load make small ops 200× slower)."""

import pytest
import torch

torch.set_num_threads(1)

from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM  # noqa: E402
from modeling_kathleen_notebook.configuration_kathleen import KR_NOTEBOOK  # noqa: E402

# [KR]'s notebook (bundled keys, the learned gate, forgetting): the tests of the general machinery run on it, since
# it exercises every path (gate, scan with decay); the defaults (bound keys, surprise writes) have their own tests
TINY = dict(d_model=24, n_layers=2, hrr_dim=256, gate_embed_dim=8, scan_chunk=32, **KR_NOTEBOOK)


def reference_config(**overrides) -> KathleenConfig:
    """KathleenConfig with [KR]'s notebook in place of the defaults' (for tests that build one at full size)."""
    return KathleenConfig(**{**KR_NOTEBOOK, **overrides})


def tiny_config(**overrides) -> KathleenConfig:
    """A model small enough that reference loops over a few thousand bytes take seconds."""
    return KathleenConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, std: float | None = None, **overrides) -> KathleenForCausalLM:
    """A tiny model in eval mode; `std` re-draws every weight with that std (beam tests need ≥ 0.3)."""
    torch.manual_seed(seed)
    model = KathleenForCausalLM(tiny_config(**overrides)).eval()
    if std is not None:
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(0.0, std)
    return model


def stream_through(module, ids, valid, step):
    """Feed a Trunk or Notebook ids in pieces of `step` positions, carrying its state: (outputs, state)."""
    state, outs = None, []
    for start in range(0, ids.shape[1], step):
        out, state = module(ids[:, start:start + step], valid[:, start:start + step], state)
        outs.append(out)
    return torch.cat(outs, dim=1), state


def run_form(form, notebook, ids, valid, state=None, write_mask=None, trunk_logits=None, first_read=0):
    """A notebook's forward with one form of scan_read.py's operation (reference, chunked or step) in place of its
    dispatcher: (reads, state)."""
    return notebook(ids, valid, state, write_mask, first_read, trunk_logits, operation=form)


# The equivalence tests that take `device` run on the CPU and, where one is present, on a CUDA device: the PyTorch
# paths (the compiled kernels are CPU-only) held to the same references there
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here: the accelerator run of this test needs one"))]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(0)


def count_crops(monkeypatch, cache_class) -> list[int]:
    """The number of bytes each crop of a cache_class cache drops, in order, filled as the test runs."""
    dropped = []
    real = cache_class.crop

    def counted(self, tokens_to_remove):
        dropped.append(-tokens_to_remove)
        return real(self, tokens_to_remove)

    monkeypatch.setattr(cache_class, "crop", counted)
    return dropped


def run_fresh_python(code: str, cwd, **env) -> str:
    """Run code in a new interpreter that has never imported this package, offline; return its stdout."""
    import os
    import subprocess
    import sys

    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **env}
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environment, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout
