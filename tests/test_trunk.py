"""The trunk's parallel form equals byte-by-byte streaming and the sequential reference (fp32, atol 1e-4)."""

import pytest
import torch

from conftest import stream_through, tiny_config
from modeling_kathleen_notebook import KathleenConfig
from modeling_kathleen_notebook.activation import gelu
from modeling_kathleen_notebook.trunk import Trunk, band_limits


@pytest.mark.parametrize("T", [1, 7, 257, 513, 3000])
def test_streaming_equals_parallel(T, device):
    torch.manual_seed(T)
    trunk = Trunk(tiny_config()).eval().to(device)
    ids = torch.randint(3, 259, (2, T)).to(device)
    valid = torch.ones(2, T, dtype=torch.bool, device=device)
    with torch.no_grad():
        full, full_states = trunk(ids, valid)
        stream, stream_states = stream_through(trunk, ids, valid, 1)
        chunked, _ = stream_through(trunk, ids, valid, 100)  # prefill pieces across scan-chunk boundaries
    torch.testing.assert_close(stream, full, rtol=0, atol=1e-4)
    torch.testing.assert_close(chunked, full, rtol=0, atol=1e-4)
    for a, b in zip(stream_states, full_states):
        torch.testing.assert_close(a.integrator, b.integrator, rtol=0, atol=1e-4)
        torch.testing.assert_close(a.conv_tail, b.conv_tail, rtol=0, atol=1e-5)


@pytest.mark.parametrize("T", [1, 7, 130])
def test_parallel_equals_sequential_reference(T, device):
    torch.manual_seed(0)
    trunk = Trunk(tiny_config()).eval().to(device)
    ids = torch.randint(3, 259, (3, T)).to(device)
    valid = (torch.rand(3, T) > 0.2).to(device)  # padding anywhere: state must hold at those positions
    with torch.no_grad():
        fast, fast_states = trunk(ids, valid)
        ref, ref_states = trunk(ids, valid, reference=True)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-4)
    for a, b in zip(fast_states, ref_states):
        torch.testing.assert_close(a.integrator, b.integrator, rtol=0, atol=1e-5)


def test_padding_holds_the_state():
    torch.manual_seed(0)
    trunk = Trunk(tiny_config()).eval()
    ids = torch.randint(3, 259, (1, 20))
    with torch.no_grad():
        _, before = trunk(ids, torch.ones(1, 20, dtype=torch.bool))
        _, after = trunk(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 5, dtype=torch.bool), before)
    torch.testing.assert_close(after[0].integrator, before[0].integrator, rtol=0, atol=0)


def test_bands_by_channel_index():
    lo, hi = band_limits(100, KathleenConfig().decay_bands, torch.device("cpu"))
    assert lo[:33].eq(0.5).all() and lo[33:66].eq(0.9).all() and lo[66:].eq(0.95).all()  # remainder: slow band
    assert hi[-1] == 0.9995


def test_parameter_counts():
    needle = sum(p.numel() for p in Trunk(KathleenConfig(d_model=96, n_layers=2)).parameters())
    text = sum(p.numel() for p in Trunk(KathleenConfig(d_model=128, n_layers=3)).parameters())
    needle += 96 * 259  # the lm_head lives in KathleenForCausalLM
    assert needle == 201_024 and abs(needle - 201_000) / 201_000 < 0.05  # SPEC §2: ≈ 201K
    assert abs(text + 128 * 259 - 467_000) / 467_000 < 0.05, text


@pytest.mark.parametrize("shape", [(1, 1, 384), (3, 32), (2, 100, 96)])  # the small route, then oneDNN's
def test_gelu_equals_torch_gelu_with_gradients(shape):
    x = torch.randn(shape, requires_grad=True)
    ours = gelu(x)
    (grad,) = torch.autograd.grad(ours, x, torch.ones_like(ours))
    expected = torch.nn.functional.gelu(x)
    (expected_grad,) = torch.autograd.grad(expected, x, torch.ones_like(expected))
    assert ours.shape == x.shape
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("grad", [False, True])
def test_decoding_step_equals_forward(grad, device):
    """`TrunkBlock.step` (one byte, no padding: what decoding runs) equals `forward` at T = 1, in values and,
    with autograd, in parameter gradients; the weights it keeps between calls follow an in-place update."""
    torch.manual_seed(0)
    block = Trunk(tiny_config()).blocks[0].eval().to(device)
    with torch.no_grad():
        state = block(torch.randn(2, 9, 24, device=device), None)[1]
    h = torch.randn(2, 1, 24, device=device)
    all_valid = torch.ones(2, 1, dtype=torch.bool, device=device)  # a mask sends forward down its general path
    with torch.set_grad_enabled(grad):
        for _ in range(2):
            outputs = [block.step(h, state), block(h, all_valid, state)]
            (ours, ours_state), (general, general_state) = outputs
            torch.testing.assert_close(ours, general, rtol=0, atol=1e-5)
            torch.testing.assert_close(ours_state.integrator, general_state.integrator, rtol=0, atol=1e-6)
            torch.testing.assert_close(ours_state.conv_tail, general_state.conv_tail, rtol=0, atol=0)
            with torch.no_grad():  # the reference reads the weights themselves, never the kept ones
                torch.testing.assert_close(ours, block.forward_reference(h, None, state)[0], rtol=0, atol=1e-5)
            if grad:
                grads = [torch.autograd.grad(out.sum(), list(block.parameters()), allow_unused=True)
                         for out, _ in outputs]
                for a, b in zip(*grads):
                    assert (a is None) == (b is None)
                    if a is not None:
                        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
            with torch.no_grad():
                block.conv_weight.mul_(2.0)
                block.mix_proj.weight.add_(0.1)
    assert block(h, None, state)[0].shape == (2, 1, 24)  # no mask and a state: the step
