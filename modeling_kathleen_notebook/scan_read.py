"""The notebook's scan fused with its read (SPEC §3, equations (3)-(5) on rfft spectra): the sequential
reference and the fast path, with the read-outs they share.

    M_t = a_t · M_{t-1} + β_t · w_t        memory spectrum [F]; a_t the keep factor (1 without forgetting)
    r_t = read_out(M_t ⊙ q_t)              w_t = K_{t-1} ⊙ CV[x_t] the write, q_t = conj(K_t) the query

`scan_and_read_reference` runs the loop in time on dense writes and queries and reads every M_t.
`scan_and_read` is the fast path. Within a chunk of positions, with P_t = Π_{u ≤ t} a_u,
M_t = P_t · (M_start + Σ_{u ≤ t} (β_u / P_u) w_u): one cumulative sum replaces the loop, and P_t scales the
read [V] instead of the memory [F]. `ScanReadChunk` runs a chunk in blocks of one sequence × `BLOCK`
positions on a CPU (the whole batch × `BLOCK` on an accelerator), so the [block, F] intermediates stay in
cache instead of streaming [B, T, F] tensors through memory, and its backward is written out for the same
reason (autograd would keep every intermediate, and run its own passes over them). On a CPU with the Fourier
read, a chunk's forward and backward are instead kernels.py's compiled loops (`compiled_kernels`); the
blocks remain their fallback and the oracle the tests hold them to. The queries are the keys themselves,
conjugated on the fly. Gradients flow to β, the keep factors, the initial memory and the read weights; keys
and values are fixed tables of the bytes, never trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from .kernels import fourier_kernels

BLOCK = 128  # positions per block: [128, 1025] complex64 is 1 MiB, one core's L2 cache on the machines here


def row_groups(batch: int, device: torch.device) -> list[slice]:
    """The sequences one block holds: one at a time on a CPU (its [BLOCK, F] intermediates stay in cache),
    the whole batch elsewhere (an accelerator wants a few large kernels, not one per sequence)."""
    size = 1 if device.type == "cpu" else batch
    return [slice(first, first + size) for first in range(0, batch, size)]


def interleaved(spectrum: torch.Tensor) -> torch.Tensor:
    """[..., F] complex -> [..., 2F] real as (re_0, im_0, re_1, im_1, ...): a view, no copy."""
    return torch.view_as_real(spectrum).flatten(-2)


# ---- read-outs: ⟨u, cv_b⟩ for every value b, and their adjoints ------------------------------------


class TableReadOut:
    """⟨u, cv_b⟩ for every b by Parseval: interleaved(u) @ table, table [2F, V] with the weights inside."""

    def __init__(self, table: torch.Tensor):
        self.table, self.vocab = table, table.shape[1]

    def __call__(self, unbound: torch.Tensor) -> torch.Tensor:
        """[..., F] complex -> [..., V]."""
        return interleaved(unbound) @ self.table

    def adjoint(self, grad: torch.Tensor) -> torch.Tensor:
        """The gradient [..., F] complex of Σ grad · self(u) with respect to u, for grad [..., V]."""
        return torch.view_as_complex((grad @ self.table.T).unflatten(-1, (-1, 2)).contiguous())


class FourierReadOut:
    """The read for the Fourier value codebook (SPEC §8.1), whose row b has spectrum exp(2πi k_f b / N).

    With Parseval weights m_f = gain · (1/2 at DC and Nyquist, 1 elsewhere),
    Σ_f m_f Re(u_f e^{-2πi k_f b / N}) = gain · Re FFT_N(H)_b, H_k = Σ_{f: k_f = k} (halved at the edges) u_f:
    one scatter-add and one N-point FFT per position instead of a [2F, V] product.
    """

    def __init__(self, frequencies: torch.Tensor, period: int, vocab: int, gain: float):
        self.frequencies, self.period, self.vocab, self.gain = frequencies, period, vocab, gain
        self.edges = torch.tensor([0, len(frequencies) - 1], device=frequencies.device)  # DC and Nyquist: weight 1/2
        self.edge_bins = frequencies[self.edges]

    def __call__(self, unbound: torch.Tensor) -> torch.Tensor:
        """[..., F] complex -> [..., V]."""
        bins = unbound.new_zeros(*unbound.shape[:-1], self.period).index_add_(-1, self.frequencies, unbound)
        bins.index_add_(-1, self.edge_bins, unbound.index_select(-1, self.edges), alpha=-0.5)
        return self.read_bins(bins)

    def read_bins(self, bins: torch.Tensor) -> torch.Tensor:
        """The read from the bins H [..., N] complex -> [..., V]."""
        return torch.fft.fft(bins, dim=-1).real[..., :self.vocab] * self.gain

    def adjoint(self, grad: torch.Tensor) -> torch.Tensor:
        """∂/∂u_f of Σ_b grad_b Re Σ_k H_k e^{-2πikb/N} is Σ_b grad_b e^{+2πi k_f b/N} = N · ifft(grad)_{k_f}.
        grad [..., V] -> [..., F]."""
        picked = pick_columns(self.adjoint_bins(grad), self.frequencies)
        picked[..., self.edges] *= 0.5
        return picked

    def adjoint_bins(self, grad: torch.Tensor) -> torch.Tensor:
        """The adjoint before the frequencies are picked (and DC and Nyquist halved): [..., V] -> [..., N]."""
        return torch.fft.ifft(grad * self.gain, n=self.period, dim=-1, norm="forward")  # zero-padded, no 1/N


ReadOut = TableReadOut | FourierReadOut


def compiled_kernels(read_out: ReadOut, *spectra: torch.Tensor) -> ModuleType | None:
    """kernels.py's compiled kernels where they apply (the Fourier read, with these spectra all complex64 on
    a CPU, and the kernels build here), else None: the callers then run their PyTorch ops."""
    if isinstance(read_out, FourierReadOut) and all(x.device.type == "cpu" and x.dtype == torch.complex64
                                                    for x in spectra):
        return fourier_kernels()
    return None


def pick_columns(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[..., index] for complex x. complex64 goes through `torch.gather` on its 8-byte float64 view (bits
    copied, never computed on): ten times faster here than `index_select` on the last dimension."""
    x = x.resolve_conj()  # an FFT may hand back a lazily conjugated view, which has no float64 view
    if x.dtype == torch.complex64 and x.stride(-1) == 1:
        words = x.view(torch.float64)
        return torch.gather(words, -1, index.expand(*x.shape[:-1], -1)).view(torch.complex64)
    return x.index_select(-1, index)


# ---- what is written and what is asked ------------------------------------------------------------


@dataclass
class Bindings:
    """The notebook's writes and queries, kept as the keys they are made of:

        w_t = σ_{t-1} K_{t-1} ⊙ CV[x_t]        q_t = σ_t conj(K_t)

    keys [B, T+1, F] complex: the unnormalised key spectra of positions -1 .. T-1; key_scales [B, T+1]:
    σ = 1 / ‖k‖ (0 for a window of padding); value_ids [B, T]: x_t; value_spectra [V, F]: CV, times the binding
    scale of the FFT convention. σ is a number per position, so the fast path folds it into its coefficients
    and never forms q on [B, T, F] (w only unscaled, a block at a time); `writes` and `queries` form both,
    for the reference and for the memory's bookkeeping (unlearning, attribution).
    """

    keys: torch.Tensor
    key_scales: torch.Tensor
    value_ids: torch.Tensor
    value_spectra: torch.Tensor

    @property
    def length(self) -> int:
        return self.value_ids.shape[1]

    def unscaled_writes(self, rows: slice = slice(None), positions: slice | None = None) -> torch.Tensor:
        """K_{t-1} ⊙ CV[x_t] [B, T, F] (or of some rows and positions), without σ_{t-1} (index_select: faster
        than indexing with the ids)."""
        positions = slice(0, self.length) if positions is None else positions
        ids = self.value_ids[rows, positions]
        values = self.value_spectra.index_select(0, ids.flatten()).view(*ids.shape, -1)
        return values.mul_(self.keys[rows, positions])  # keys[:, t] is K_{t-1}

    def writes(self) -> torch.Tensor:
        """w_t [B, T, F]."""
        return self.unscaled_writes() * self.key_scales[:, :-1, None]

    def normalised_keys(self) -> torch.Tensor:
        """σ_t K_t [B, T, F] for t = 0 .. T-1 (the query is its conjugate)."""
        return self.keys[:, 1:] * self.key_scales[:, 1:, None]

    def queries(self) -> torch.Tensor:
        """q_t [B, T, F]."""
        return self.normalised_keys().conj()

    def part(self, positions: slice) -> Bindings:
        """The bindings of positions [start, stop) (their keys reach back one position)."""
        keys = slice(positions.start, positions.stop + 1)
        return Bindings(self.keys[:, keys], self.key_scales[:, keys], self.value_ids[:, positions],
                        self.value_spectra)


# ---- scan and read: the reference and the fast path -----------------------------------------------


def scan_and_read_reference(
    writes: torch.Tensor,
    queries: torch.Tensor,
    beta: torch.Tensor,
    keep: torch.Tensor | None,
    read_out: ReadOut,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every memory M_t by the plain loop in time, then read_out(M_t ⊙ q_t): the oracle for `scan_and_read`.

    writes, queries [B, T, F] complex; beta, keep [B, T] (keep None: no forgetting); initial_state [B, F]
    -> reads [B, T, V] and the last memory [B, F].
    """
    memory = torch.zeros_like(writes[:, 0]) if initial_state is None else initial_state
    memories = []
    for t in range(writes.shape[1]):
        decay = 1.0 if keep is None else keep[:, t].unsqueeze(-1)
        memory = decay * memory + beta[:, t].unsqueeze(-1) * writes[:, t]
        memories.append(memory)
    return read_out(torch.stack(memories, dim=1) * queries), (memory if output_final_state else None)


def scan_and_read(
    bindings: Bindings,
    beta: torch.Tensor,
    keep: torch.Tensor | None,
    read_out: ReadOut,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 128,
    first_read: int = 0,
    read_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`scan_and_read_reference` of the bindings' writes and queries, fast: chunks of `chunk_size`
    positions (one chunk without forgetting), each a `ScanReadChunk`. chunk_size · log(1 / min keep) < 80
    keeps 1/P finite in fp32. read_weights ρ [B, T] multiply each position's read (the notebook's read
    scale, 0 at padding), folded into the chunk's per-position factor instead of a pass over [B, T, V].

    Only positions from `first_read` on are read (reads [B, T - first_read, V]): a chunk that ends before it
    only advances the memory, M_end = P_end · (M_start + Σ_u (β_u / P_u) w_u), one weighted sum instead of
    a cumulative sum and a read at every position (prefill keeps the last logits only).
    """
    T = bindings.length
    if T == 1:  # one decoding step: M = keep · M + β w, then read; σ is a number per position
        scales = bindings.key_scales  # [B, 2]: σ_{t-1}, σ_t
        coeff = beta * scales[:, :1]  # [B, 1]
        written = bindings.unscaled_writes()[:, 0]
        memory = coeff * written if initial_state is None else torch.addcmul(
            initial_state if keep is None else keep * initial_state, coeff, written)
        factor = scales[:, 1:] if read_weights is None else scales[:, 1:] * read_weights  # [B, 1]
        read = read_out((memory * bindings.keys[:, 1].conj()).unsqueeze(1)) * factor.unsqueeze(-1)
        return read[:, first_read:], (memory if output_final_state else None)
    step = T if keep is None else chunk_size
    cuts = sorted({*range(0, T, step), first_read} - {T})  # a chunk starts where reading starts
    memory, reads = initial_state, []
    for start, stop in zip(cuts, cuts[1:] + [T]):
        part = slice(start, stop)
        if keep is None:
            prod, coeff = None, beta[:, part]
        else:
            prod = torch.cumprod(keep[:, part], dim=1)  # P_t [B, C]
            coeff = beta[:, part] / prod
        if stop <= first_read:  # nothing to read here: the memory at the chunk's end is all that is needed
            summed = torch.bmm(coeff.unsqueeze(1).to(bindings.keys.dtype), bindings.part(part).writes()).squeeze(1)
            summed = summed if memory is None else summed + memory
        else:
            weights = None if read_weights is None else read_weights[:, part]
            read, summed = ScanReadChunk.apply(coeff, prod, bindings.part(part), memory, read_out, weights)
            reads.append(read[:, max(first_read - start, 0):])
        memory = summed if prod is None else summed * prod[:, -1:]
    return torch.cat(reads, dim=1), (memory if output_final_state else None)


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
        keys = bindings.keys
        write_coeff = coeff * bindings.key_scales[:, :-1]
        ctx.kernels = compiled_kernels(read_out, keys, bindings.value_spectra)
        if ctx.kernels is not None:
            bins, end = ctx.kernels.scan_read_bins(bindings.value_spectra, bindings.value_ids, keys, write_coeff,
                                                   keys.new_empty(0) if start is None else start,
                                                   read_out.frequencies, read_out.period)
            raw = read_out.read_bins(bins)
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
                bindings.value_spectra, bindings.value_ids, bindings.keys, read_out.adjoint_bins(grad_raw), grad_end,
                read_out.frequencies)
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
