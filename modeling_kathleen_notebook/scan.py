"""The first-order linear recurrence h_t = a_t · h_{t-1} + x_t, three ways.

Both memories of the model are this recurrence: the trunk's leaky integrators (a = γ, x = (1 - γ) v,
real) and the notebook's forgetting memory (a = 1 - g β, x = β w, complex spectra). Every function
shares one signature, so tests swap one for another:

    f(decay, inputs, initial_state=None, output_final_state=False) -> (states, final_state)

`linear_scan` differentiates the chunked form by its adjoint, a second chunked scan backwards in time
(`ChunkedLinearScan`), not through its divisions: autograd through P_t would divide by P_t², which leaves fp32
when a decay sits at its floor for a whole chunk (γ = 0.5 for 64 steps: 2^-128) and turns the gradient into NaN.

    decay   [B, T, *]  real, broadcastable against inputs, each entry in (0, 1]
    inputs  [B, T, *]  real or complex
    states  [B, T, *]  h_t for every t
    final   [B, *]     h_{T-1} (None unless output_final_state)

Pure tensor functions: no modules, no config, no cache.
"""

from __future__ import annotations

import torch


def linear_scan_reference(
    decay: torch.Tensor,
    inputs: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The recurrence as a plain loop over time: the oracle for the fast forms below."""
    decay = decay.expand_as(inputs) if decay.dim() == inputs.dim() else decay
    h = torch.zeros_like(inputs[:, 0]) if initial_state is None else initial_state
    states = []
    for t in range(inputs.shape[1]):
        h = decay[:, t] * h + inputs[:, t]
        states.append(h)
    out = torch.stack(states, dim=1)
    return out, (h if output_final_state else None)


def linear_scan_step(
    decay: torch.Tensor,
    inputs: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step (T = 1): the generation path. Same result as the reference at T = 1."""
    h = inputs[:, 0] if initial_state is None else decay[:, 0] * initial_state + inputs[:, 0]
    return h.unsqueeze(1), (h if output_final_state else None)


def linear_scan_chunked(
    decay: torch.Tensor,
    inputs: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Parallel form for training and prefill; its oracle is `linear_scan_reference`.

    Inside a chunk, with P_t = a_1 ··· a_t the running product of decays since the chunk start,
    h_t = P_t · (h_start + Σ_{u ≤ t} x_u / P_u): two cumulative ops instead of T steps. The carry
    between chunks is the last state. The caller picks `chunk_size` so that P stays a normal fp32
    number: chunk_size · log(1 / min decay) < 80 (γ ≥ 0.5 allows 64, the notebook's keep ≥ 0.75
    clamp allows 256).
    """
    B, T = inputs.shape[:2]
    decay = decay.expand(B, T, *decay.shape[2:])
    h = initial_state
    chunks = []
    for start in range(0, T, chunk_size):
        a = decay[:, start:start + chunk_size]
        x = inputs[:, start:start + chunk_size]
        prod = torch.cumprod(a, dim=1)  # P_t, [B, C, *]
        acc = torch.cumsum(x / prod, dim=1)
        if h is not None:
            acc = acc + h.unsqueeze(1)
        states = prod * acc
        h = states[:, -1]
        chunks.append(states)
    out = torch.cat(chunks, dim=1)
    return out, (h if output_final_state else None)


class ChunkedLinearScan(torch.autograd.Function):
    """`linear_scan_chunked` with the recurrence's own backward: the adjoint dh_t = g_t + a_{t+1} dh_{t+1} is the
    same recurrence run backwards in time, so it is one more chunked scan; then dx_t = dh_t,
    da_t = Re(dh_t conj(h_{t-1})) and dh_start = a_0 dh_0."""

    @staticmethod
    def forward(ctx, decay, inputs, initial_state, chunk_size):
        states, _ = linear_scan_chunked(decay, inputs, initial_state, False, chunk_size)
        ctx.save_for_backward(decay, states, initial_state)
        ctx.chunk_size = chunk_size
        return states

    @staticmethod
    def backward(ctx, grad_states):
        decay, states, initial_state = ctx.saved_tensors
        B, T = states.shape[:2]
        full = decay.expand(B, T, *decay.shape[2:])
        # a_{t+1} for every t; the last position has no successor, and its decay of 1 is never used (no carry in)
        later = torch.cat([full[:, 1:], torch.ones_like(full[:, :1])], dim=1)
        dh = linear_scan_chunked(later.flip(1), grad_states.flip(1), None, False, ctx.chunk_size)[0].flip(1)
        start = torch.zeros_like(states[:, :1]) if initial_state is None else initial_state.unsqueeze(1)
        before = torch.cat([start, states[:, :-1]], dim=1)  # h_{t-1}
        grad_decay = (dh * before.conj()).real if dh.is_complex() else dh * before
        grad_initial = None if initial_state is None else full[:, 0] * dh[:, 0]
        return grad_decay.sum_to_size(decay.shape), dh, grad_initial, None


def linear_scan(
    decay: torch.Tensor,
    inputs: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The one place that picks a form: one step for T = 1 (generation), chunks otherwise (differentiated by
    `ChunkedLinearScan` when a gradient is wanted)."""
    if inputs.shape[1] == 1:
        return linear_scan_step(decay, inputs, initial_state, output_final_state)
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (decay, inputs, initial_state))
    if not wants_grad:
        return linear_scan_chunked(decay, inputs, initial_state, output_final_state, chunk_size)
    states = ChunkedLinearScan.apply(decay, inputs, initial_state, chunk_size)
    return states, (states[:, -1] if output_final_state else None)


def cumulative_sum_scan(
    inputs: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The recurrence with every decay equal to 1 (a notebook without forgetting): one cumsum."""
    out = torch.cumsum(inputs, dim=1)
    if initial_state is not None:
        out = out + initial_state.unsqueeze(1)
    return out, (out[:, -1] if output_final_state else None)


def last_real_rows(valid: torch.Tensor | None, batch: int, length: int, device: torch.device) -> torch.Tensor:
    """[B, T] long: for each position t, 1 + the index of the last real position at or before t, or 0 where there
    is none in this call (valid [B, T], None: all real). Row r of [before the call, position 0, ...] is what
    position t sees as its latest; a cumulative max, the scan of "the last real one"."""
    rows = torch.arange(1, length + 1, device=device).expand(batch, length)
    if valid is not None:
        rows = torch.where(valid, rows, 0)
    return rows.cummax(dim=1).values
