"""The notebook's read-out: ⟨u, cv_b⟩ for every value byte b of an unbound spectrum u (SPEC §3 (5), §8.1),
and its adjoint for the backward. Two forms: a product with a [2F, V] table (any value codebook), and for the
Fourier value codebook one scatter-add and one N-point FFT.
"""

from __future__ import annotations

import torch


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

    def read_half_bins(self, half: torch.Tensor) -> torch.Tensor:
        """The read from the Hermitian half of the bins, H'_j = (conj(H_j) + H_{N-j}) / 2 for j = 0 .. N/2
        [..., N/2 + 1] (what the compiled scan accumulates: kernels.cpp's `half_bins`) -> [..., V]: Re FFT_N(H) is
        the real inverse FFT of H' without its 1/N."""
        return torch.fft.irfft(half, n=self.period, dim=-1, norm="forward")[..., :self.vocab] * self.gain

    def adjoint_half_bins(self, grad: torch.Tensor) -> torch.Tensor:
        """rfft_N(gain · grad) [..., N/2 + 1] for grad [..., V]: the compiled backward picks the adjoint of bin k
        (`adjoint_bins`' column k) from it, its conjugate or its mirror's."""
        return torch.fft.rfft(grad * self.gain, n=self.period, dim=-1)

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


def pick_columns(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[..., index] for complex x. complex64 goes through `torch.gather` on its 8-byte float64 view (bits
    copied, never computed on): ten times faster here than `index_select` on the last dimension."""
    x = x.resolve_conj()  # an FFT may hand back a lazily conjugated view, which has no float64 view
    if x.dtype == torch.complex64 and x.stride(-1) == 1:
        words = x.view(torch.float64)
        return torch.gather(words, -1, index.expand(*x.shape[:-1], -1)).view(torch.complex64)
    return x.index_select(-1, index)
