"""The chunked and one-step scans equal the plain loop: outputs, final states and gradients."""

import pytest
import torch

from modeling_kathleen_notebook.scan import (
    cumulative_sum_scan,
    linear_scan,
    linear_scan_chunked,
    linear_scan_reference,
    linear_scan_step,
)


@pytest.mark.parametrize("T", [1, 7, 64, 257])
@pytest.mark.parametrize("complex_inputs", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_scan_equals_reference(T, complex_inputs, with_state, device):
    g = torch.Generator().manual_seed(T)
    B, D = 3, 5
    decay = (0.5 + 0.5 * torch.rand(B, T, D, generator=g, dtype=torch.float64)).to(device).requires_grad_()
    dtype = torch.complex128 if complex_inputs else torch.float64
    x = torch.randn(B, T, D, generator=g, dtype=dtype).to(device).requires_grad_()
    h0 = torch.randn(B, D, generator=g, dtype=dtype).to(device) if with_state else None
    ref, ref_final = linear_scan_reference(decay, x, h0, output_final_state=True)
    weights = torch.randn(B, T, D, generator=g, dtype=torch.float64).to(device)
    last = torch.randn(B, D, generator=g, dtype=dtype).to(device)  # the final state gets its own weights
    grads_ref = torch.autograd.grad((ref.real * weights).sum() + (ref_final * last).real.sum(), (decay, x),
                                    allow_unused=True, materialize_grads=True)
    for fast_form in (linear_scan_chunked, linear_scan):  # autograd through the chunks, and the adjoint scan
        fast, fast_final = fast_form(decay, x, h0, output_final_state=True, chunk_size=32)
        torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(fast_final, ref_final, rtol=1e-9, atol=1e-9)
        grads_fast = torch.autograd.grad((fast.real * weights).sum() + (fast_final * last).real.sum(), (decay, x),
                                         allow_unused=True, materialize_grads=True)  # T = 1: no decay used
        for a, b in zip(grads_fast, grads_ref):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("complex_inputs", [False, True])
def test_adjoint_scan_gradients_of_a_broadcast_decay_and_a_start_state(complex_inputs, device):
    """The notebook's shape: one keep factor per position [B, T, 1] for a whole spectrum, and a start state."""
    g = torch.Generator().manual_seed(7)
    dtype = torch.complex128 if complex_inputs else torch.float64
    keep = (0.75 + 0.25 * torch.rand(2, 100, 1, generator=g, dtype=torch.float64)).to(device).requires_grad_()
    x = torch.randn(2, 100, 6, generator=g, dtype=dtype).to(device).requires_grad_()
    h0 = torch.randn(2, 6, generator=g, dtype=dtype).to(device).requires_grad_()
    weights = torch.randn(2, 100, 6, generator=g, dtype=dtype).to(device)
    ref, _ = linear_scan_reference(keep.expand(2, 100, 6), x, h0)
    fast, _ = linear_scan(keep, x, h0, chunk_size=32)
    expected = torch.autograd.grad((ref * weights).real.sum(), (keep, x, h0))
    for a, b in zip(torch.autograd.grad((fast * weights).real.sum(), (keep, x, h0)), expected):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_gradient_stays_finite_when_decays_sit_at_their_floor():
    """γ = 0.5 (the trunk's lowest) for whole 64-step chunks in fp32: the running product reaches 2^-64, and
    autograd through the chunked form divides by its square (the control: non-finite), while the adjoint scan
    gives the reference's gradient."""
    g = torch.Generator().manual_seed(3)
    decay = torch.full((2, 192, 4), 0.5, requires_grad=True)
    x = torch.randn(2, 192, 4, generator=g, requires_grad=True)
    weights = torch.randn(2, 192, 4, generator=g)
    control = torch.autograd.grad((linear_scan_chunked(decay, x, chunk_size=64)[0] * weights).sum(), (decay, x))
    assert not all(torch.isfinite(grad).all() for grad in control)
    grads = torch.autograd.grad((linear_scan(decay, x, chunk_size=64)[0] * weights).sum(), (decay, x))
    decay64, x64 = decay.detach().double().requires_grad_(), x.detach().double().requires_grad_()
    expected = torch.autograd.grad((linear_scan_reference(decay64, x64)[0] * weights.double()).sum(), (decay64, x64))
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_step_and_dispatch_equal_reference(device):
    g = torch.Generator().manual_seed(1)
    decay, x, h0 = (t.to(device) for t in (torch.rand(2, 1, 4, generator=g), torch.randn(2, 1, 4, generator=g),
                                          torch.randn(2, 4, generator=g)))
    ref, ref_final = linear_scan_reference(decay, x, h0, output_final_state=True)
    for fn in (linear_scan_step, linear_scan):
        out, final = fn(decay, x, h0, output_final_state=True)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(final, ref_final)


def test_broadcast_decay_and_cumsum_special_case():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 300, 6, generator=g, dtype=torch.complex64)
    h0 = torch.randn(2, 6, generator=g, dtype=torch.complex64)
    ones = torch.ones(2, 300, 1)
    ref, ref_final = linear_scan_reference(ones.expand(2, 300, 6), x, h0, output_final_state=True)
    out, final = cumulative_sum_scan(x, h0, output_final_state=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    keep = 0.75 + 0.25 * torch.rand(2, 300, 1, generator=g)
    ref, _ = linear_scan_reference(keep.expand(2, 300, 6), x, h0)
    out, _ = linear_scan_chunked(keep, x, h0, chunk_size=256)  # the notebook's longest allowed chunk
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
