"""One chunk of the notebook's scan fused with its read (SPEC §3 (3)-(5) on rfft spectra), with its backward:
the chunked form of `scan_read.py`'s operation.

Within a chunk, with P_t = Π_{u ≤ t} a_u, M_t = P_t · (M_start + Σ_{u ≤ t} (β_u / P_u) w_u): one cumulative sum
replaces the loop in time, and P_t scales the read [V] instead of the memory [F]. `ScanReadChunk` runs a chunk in
blocks of one sequence × `BLOCK` positions on a CPU (the whole batch × `BLOCK` on an accelerator), so the
[block, F] intermediates stay in cache instead of streaming [B, T, F] tensors through memory, and its backward is
written out for the same reason (autograd would keep every intermediate, and run its own passes over them). On a
CPU with the Fourier read, a chunk's forward and backward are instead kernels.py's compiled loops
(`compiled_kernels`); the blocks remain their fallback, and `scan_and_read_reference` the oracle of both.
The queries are the keys themselves, conjugated on the fly. Gradients flow to β, the keep factors, the initial
memory and the read weights; keys and values are fixed tables of the bytes, never trained.
"""

from __future__ import annotations

from types import ModuleType

import torch

from .codebooks import Bindings
from .kernels import fourier_kernels
from .read_out import FourierReadOut, ReadOut, interleaved

BLOCK = 128  # positions per block: [128, 1025] complex64 is 1 MiB, one core's L2 cache on the machines here


def row_groups(batch: int, device: torch.device) -> list[slice]:
    """The sequences one block holds: one at a time on a CPU (its [BLOCK, F] intermediates stay in cache),
    the whole batch elsewhere (an accelerator wants a few large kernels, not one per sequence)."""
    size = 1 if device.type == "cpu" else batch
    return [slice(first, first + size) for first in range(0, batch, size)]


def kernel_keys(bindings: Bindings) -> tuple[torch.Tensor, ...]:
    """The keys as the compiled kernels take them: (keys, key ids, residues, roots) with the formed keys and the
    rest empty, or, for bound keys not formed yet, an empty keys tensor and what the kernels form them from."""
    bound = bindings.bound_keys
    if bindings.formed_keys is not None or bound is None:
        empty = bindings.value_ids.new_empty(0)
        return bindings.keys, empty, empty, empty
    return bindings.value_spectra.new_empty(0), bound.ids, bound.residues, bound.roots


def compiled_kernels(read_out: ReadOut, *spectra: torch.Tensor) -> ModuleType | None:
    """kernels.py's compiled kernels where they apply (the Fourier read, with these spectra all complex64 on
    a CPU, and the kernels build here), else None: the callers then run their PyTorch ops."""
    if isinstance(read_out, FourierReadOut) and all(x.device.type == "cpu" and x.dtype == torch.complex64
                                                    for x in spectra):
        return fourier_kernels()
    return None


class ScanReadChunk(torch.autograd.Function):
    """One chunk: S_t = M_start + Σ_{u ≤ t} c_u w_u and reads P_t · read_out(S_t ⊙ q_t), by kernels.py's
    compiled loops where they apply (`compiled_kernels`), else in PyTorch blocks (`blocks`, `blocks_backward`).

    forward(coeff [B, C], prod [B, C] or None (all 1), bindings of the chunk, start [B, F] or None, read_out,
    weights ρ [B, C] or None (all 1)) -> reads [B, C, V], S at the chunk's end [B, F]. The key scales σ are
    numbers per position, so they join the coefficients (c_u σ_{u-1}) and the read's row factor (P_t σ_t ρ_t);
    the unscaled writes K_{t-1} ⊙ CV[x_t] are formed per block, in the forward and again in the backward
    (cheaper than keeping [B, C, F] of them in memory), the queries conj(K_t) on the fly. The
    backward needs no S: with g_S_t = read_out.adjoint(P_t σ_t ρ_t g_read_t) ⊙ K_t (plus the end state's
    gradient at the last position), the gradient of c_u is σ_{u-1} Re⟨Σ_{t ≥ u} g_S_t, w_u⟩, of M_start is
    Σ_t g_S_t, and with d_t = ⟨g_read_t, read_out(S_t ⊙ q_t)⟩ those of P_t and ρ_t are d_t σ_t ρ_t and
    d_t σ_t P_t.
    """

    @staticmethod
    def forward(ctx, coeff, prod, bindings, start, read_out, weights):
        write_coeff = coeff * bindings.key_scales[:, :-1]
        keys = kernel_keys(bindings)  # the kernels read the formed keys, or the roots they form bound keys from
        ctx.kernels = compiled_kernels(read_out, bindings.value_spectra, keys[0] if keys[0].numel() else keys[3])
        if ctx.kernels is not None:
            bins, end = ctx.kernels.scan_read_bins(bindings.value_spectra, bindings.value_ids, *keys, write_coeff,
                                                   write_coeff.new_empty(0) if start is None else start,
                                                   read_out.frequencies, read_out.period)
            raw = read_out.read_half_bins(bins)
        else:
            raw, end = ScanReadChunk.blocks(bindings, write_coeff, start, read_out)
        row_factor = bindings.key_scales[:, 1:]
        for factor in (prod, weights):
            row_factor = row_factor if factor is None else row_factor * factor
        ctx.save_for_backward(prod, weights, raw, row_factor)
        ctx.bindings, ctx.read_out, ctx.has_start = bindings, read_out, start is not None
        return raw * row_factor.unsqueeze(-1), end

    @staticmethod
    def backward(ctx, grad_reads, grad_end):
        prod, weights, raw, row_factor = ctx.saved_tensors
        bindings, read_out = ctx.bindings, ctx.read_out
        grad_prod = grad_weights = None
        if prod is not None or weights is not None:
            scaled_dot = (grad_reads * raw).sum(-1) * bindings.key_scales[:, 1:]  # d_t σ_t
            grad_prod = None if prod is None else scaled_dot if weights is None else scaled_dot * weights
            grad_weights = None if weights is None else scaled_dot if prod is None else scaled_dot * prod
        grad_raw = grad_reads * row_factor.unsqueeze(-1)
        if ctx.kernels is not None:
            grad_write_coeff, grad_start = ctx.kernels.scan_read_bins_backward(
                bindings.value_spectra, bindings.value_ids, *kernel_keys(bindings),
                read_out.adjoint_half_bins(grad_raw), grad_end, read_out.frequencies, read_out.period)
        else:
            grad_write_coeff, grad_start = ScanReadChunk.blocks_backward(bindings, grad_raw, grad_end, read_out)
        grad_coeff = grad_write_coeff * bindings.key_scales[:, :-1]
        return grad_coeff, grad_prod, None, grad_start if ctx.has_start else None, None, grad_weights

    @staticmethod
    def blocks(
        bindings: Bindings, write_coeff: torch.Tensor, start: torch.Tensor | None, read_out: ReadOut
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward in PyTorch ops, a block at a time: raw reads read_out(S_t ⊙ q_t) [B, C, V] (before the row
        factor) and S at the chunk's end [B, F], for the write coefficients c_u σ_{u-1} [B, C]."""
        keys = bindings.keys
        B, C = bindings.value_ids.shape
        raw = write_coeff.new_empty(B, C, read_out.vocab)
        end = torch.empty_like(keys[:, 0])
        for rows in row_groups(B, keys.device):
            summed = None if start is None else start[rows]
            for first in range(0, C, BLOCK):
                block, asked = slice(first, min(first + BLOCK, C)), slice(first + 1, min(first + BLOCK, C) + 1)
                # the block's writes, formed here (and again in the backward) so that they stay in cache
                state = bindings.unscaled_writes(rows, block).mul_(write_coeff[rows, block].unsqueeze(-1))  # [r, c, F]
                if summed is not None:
                    state[:, 0] += summed
                state.cumsum_(dim=1)  # in place: a little faster than a new tensor
                summed = state[:, -1].clone()
                raw[rows, block] = read_out(state * keys[rows, asked].conj())  # keys[:, 1:] are K_t
            end[rows] = summed
        return raw, end

    @staticmethod
    def blocks_backward(
        bindings: Bindings, grad_raw: torch.Tensor, grad_end: torch.Tensor, read_out: ReadOut
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The backward of `blocks`, a block at a time (in reverse): the gradients of the write coefficients
        [B, C] and of the start state [B, F], for the gradient of the raw reads grad_raw [B, C, V]."""
        keys = bindings.keys
        B, C = bindings.value_ids.shape
        grad_write_coeff = grad_raw.new_empty(B, C)
        grad_start = torch.empty_like(keys[:, 0])
        for rows in row_groups(B, keys.device):
            later = grad_end[rows]  # Σ of g_S over the positions after the block
            for first in reversed(range(0, C, BLOCK)):
                block, asked = slice(first, min(first + BLOCK, C)), slice(first + 1, min(first + BLOCK, C) + 1)
                grad_state = read_out.adjoint(grad_raw[rows, block]) * keys[rows, asked]  # [r, c, F]
                grad_state[:, -1] += later
                suffix = grad_state.flip(1).cumsum_(1).flip(1)  # Σ_{t ≥ u} g_S_t
                written = interleaved(bindings.unscaled_writes(rows, block))
                grad_write_coeff[rows, block] = (interleaved(suffix) * written).sum(-1)
                later = suffix[:, 0]
            grad_start[rows] = later
        return grad_write_coeff, grad_start
