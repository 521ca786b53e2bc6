"""The notebook (SPEC §3): a fixed-key holographic associative memory that biases next-byte logits.

At position t, with x_t the byte at t, ⊛ circular convolution and ⊛† circular correlation:

    (1) key_t  = ℓ2( Σ_{j<7} role_j ⊛ ck[x_{t-j}] )             missing or padded bytes are left out
    (2) β_t    = sigmoid(gate(x_{t-15..t}))                       or an oracle `write_mask`
    (3) mem    = (1 - g β_t) · mem + β_t · (key_{t-1} ⊛ cv[x_t])   no write at t = 0
    (4) r_t    = mem ⊛† key_t
    (5) logits_t = s · (cv @ r_t)                                  the bias for x_{t+1}

The fast path works on rfft spectra, where ⊛ is a product: a write is K_{t-1} ⊙ CV[x_t], the memory
is a linear scan over positions, and the read skips the inverse FFT by taking every ⟨r_t, cv_b⟩ as one
real matmul against a fixed spectrum table (Parseval). `notebook_reference` is the literal loop.
State (`NotebookState`) is the memory spectrum, the previous key and the last token ids: constant size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_kathleen import PAD_ID, KathleenConfig
from .scan import cumulative_sum_scan, linear_scan


@dataclass
class NotebookState:
    """The notebook after the bytes read so far (spectra are unnormalised rfft, F = R/2 + 1 bins)."""

    memory: torch.Tensor  # [B, F] complex64, spectrum of the memory vector
    prev_key: torch.Tensor  # [B, F] complex64, spectrum of the last key
    tail: torch.Tensor  # [B, L] long, the last L token ids (pad where nothing or padding was read)


@dataclass
class NotebookTrace:
    """Everything the memory does at each position, recomputable from the bytes alone (SPEC §3)."""

    keys: torch.Tensor  # [B, T, F] complex, K_t
    writes: torch.Tensor  # [B, T, F] complex, w_t = K_{t-1} ⊙ CV[x_t]
    beta: torch.Tensor  # [B, T] write strength (0 at padding)
    keep: torch.Tensor  # [B, T] forgetting factor a_t = 1 - g β_t (1 without forgetting)


# ---- fixed codebooks -------------------------------------------------------------------------


def unitary_vectors(n: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """[n, dim] real vectors whose rfft has modulus 1 and random phase (DC and Nyquist bins = 1)."""
    phase = (torch.rand(n, dim // 2 + 1, generator=generator, dtype=torch.float64) * 2 - 1) * math.pi
    spectrum = torch.polar(torch.ones_like(phase), phase)
    spectrum[:, 0] = 1.0
    spectrum[:, -1] = 1.0
    return torch.fft.irfft(spectrum, n=dim)


def gaussian_unit_vectors(n: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """[n, dim] random Gaussian vectors scaled to unit ℓ2 norm."""
    rows = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    return rows / rows.norm(dim=1, keepdim=True)


def fourier_value_vectors(vocab: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """SPEC §8.1: row b has spectrum exp(2πi k_f b / V), one random k_f per frequency. Values only."""
    k = torch.randint(0, vocab, (dim // 2 + 1,), generator=generator, dtype=torch.float64)
    b = torch.arange(vocab, dtype=torch.float64).unsqueeze(1)
    spectrum = torch.polar(torch.ones(vocab, k.numel(), dtype=torch.float64), 2 * math.pi * k * b / vocab)
    spectrum[:, 0] = 1.0
    spectrum[:, -1] = 1.0
    return torch.fft.irfft(spectrum, n=dim)


def make_codebooks(config: KathleenConfig) -> dict[str, torch.Tensor]:
    """Key table CK [V, R], value table CV [V, R] and roles [W, R], drawn from `config.key_seed` alone."""
    generator = torch.Generator().manual_seed(config.key_seed)
    V, R = config.vocab_size, config.hrr_dim
    keys = gaussian_unit_vectors(V, R, generator)
    roles = unitary_vectors(config.key_window, R, generator)
    if config.value_codebook == "shared":
        values = keys.clone()
    elif config.value_codebook == "gaussian":
        values = gaussian_unit_vectors(V, R, generator)
    else:
        values = fourier_value_vectors(V, R, generator)
    return {"key_codebook": keys.float(), "value_codebook": values.float(), "roles": roles.float()}


def parseval_weights(R: int, device: torch.device) -> torch.Tensor:
    """m_f [F] so that ⟨x, y⟩ = Σ_f m_f Re(X_f conj(Y_f)) / R for real x, y of length R."""
    m = torch.full((R // 2 + 1,), 2.0, device=device)
    m[0] = 1.0
    m[-1] = 1.0
    return m


# ---- the literal reference -------------------------------------------------------------------


def notebook_reference(
    input_ids: torch.Tensor,
    beta: torch.Tensor,
    forget_rate: torch.Tensor | float,
    key_codebook: torch.Tensor,
    value_codebook: torch.Tensor,
    roles: torch.Tensor,
    fft_norm: str = "backward",
    keep_clamp: float = 0.75,
    initial_state: NotebookState | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, NotebookState | None]:
    """Equations (1)-(5) one byte at a time in the time domain, fp32: the oracle for `Notebook`.

    input_ids [B, T] (padding already replaced by the pad id), beta [B, T] -> raw reads cv @ r_t
    [B, T, V] (before the read scale s) and the final state.
    """
    B, T = input_ids.shape
    V, R = key_codebook.shape
    W = roles.shape[0]

    def rfft(x):
        return torch.fft.rfft(x, norm=fft_norm)

    def irfft(x):
        return torch.fft.irfft(x, n=R, norm=fft_norm)

    def cconv(a, b):
        return irfft(rfft(a) * rfft(b))

    def ccorr(a, b):
        return irfft(rfft(a) * rfft(b).conj())

    if initial_state is None:
        history = torch.full((B, W - 1), PAD_ID, dtype=torch.long, device=input_ids.device)
        mem, prev_key = key_codebook.new_zeros(B, R), key_codebook.new_zeros(B, R)
    else:
        history = initial_state.tail
        mem = torch.fft.irfft(initial_state.memory, n=R)
        prev_key = torch.fft.irfft(initial_state.prev_key, n=R)
    tail_length = history.shape[1]
    ids = torch.cat([history, input_ids], dim=1)
    reads = []
    for t in range(T):
        i = tail_length + t
        key = key_codebook.new_zeros(B, R)
        for j in range(W):  # (1): pads stand before t = 0, so terms with t - j < 0 are left out
            byte = ids[:, i - j]
            present = (byte != PAD_ID).float().unsqueeze(1)
            key = key + present * cconv(roles[j].expand(B, R), key_codebook[byte])
        norm = key.norm(dim=1, keepdim=True)
        key = torch.where(norm > 0, key / norm.clamp_min(1e-30), 0.0)
        b = beta[:, t].unsqueeze(1)
        keep = (1.0 - forget_rate * b).clamp_min(keep_clamp)
        mem = keep * mem + b * cconv(prev_key, value_codebook[ids[:, i]])  # (3)
        reads.append(ccorr(mem, key) @ value_codebook.T)  # (4), (5) without s
        prev_key = key
    final = None
    if output_final_state:
        final = NotebookState(
            torch.fft.rfft(mem).to(torch.complex64), torch.fft.rfft(prev_key).to(torch.complex64), ids[:, -tail_length:]
        )
    return torch.stack(reads, dim=1), final


# ---- the trainable module --------------------------------------------------------------------


class WriteGate(nn.Module):
    """β's logit from the last `gate_window` bytes only: no trunk state, no position (SPEC §3)."""

    def __init__(self, config: KathleenConfig):
        super().__init__()
        e = config.gate_embed_dim
        self.window = config.gate_window
        self.embed = nn.Embedding(config.vocab_size, e, padding_idx=PAD_ID)  # padding reads as nothing
        self.conv = nn.Conv1d(e, e, config.gate_window)
        self.out = nn.Linear(e, 1)

    def forward(self, ids_with_tail: torch.Tensor) -> torch.Tensor:
        """ids_with_tail [B, window-1+T] -> logits [B, T]."""
        e = self.embed(ids_with_tail).transpose(1, 2)  # [B, E, window-1+T]
        hidden = F.gelu(self.conv(e)).transpose(1, 2)  # [B, T, E]
        return self.out(hidden).squeeze(-1)


class Notebook(nn.Module):
    """Keys, gate, write, scan and read of SPEC §3, with explicit state in and out."""

    def __init__(self, config: KathleenConfig):
        super().__init__()
        self.config = config
        self.tail_length = config.tail_length
        for name, table in make_codebooks(config).items():
            self.register_buffer(name, table, persistent=True)  # stored: a non-persistent buffer is lost
        self.gate = WriteGate(config)
        self.read_scale = nn.Parameter(torch.tensor(config.effective_read_scale_init))
        self.forget_logit = nn.Parameter(torch.tensor(config.forget_logit_init))
        self._spectra_key = None
        self._spectra = None

    # fixed spectra of the buffers, recomputed only when a buffer changes (load, .to())
    def spectra(self) -> dict[str, torch.Tensor]:
        key = tuple((b.data_ptr(), b._version, b.device) for b in (self.key_codebook, self.value_codebook, self.roles))
        if key != self._spectra_key:
            R = self.config.hrr_dim
            values = torch.fft.rfft(self.value_codebook.float())  # [V, F]
            m = parseval_weights(R, values.device).unsqueeze(1) / R
            self._spectra = {
                "keys": torch.fft.rfft(self.key_codebook.float()),  # [V, F]
                "values": values,
                "roles": torch.fft.rfft(self.roles.float()),  # [W, F]
                # ⟨r, cv_b⟩ = [Re R_f, Im R_f] @ read_table[:, b]
                "read_table": torch.cat([m * values.real.T, m * values.imag.T], dim=0),  # [2F, V]
            }
            self._spectra_key = key
        return self._spectra

    @property
    def binding_scale(self) -> float:
        """Each "ortho" binding or unbinding divides by sqrt(R); "backward" is the true convolution."""
        return 1.0 / math.sqrt(self.config.hrr_dim) if self.config.fft_norm == "ortho" else 1.0

    def forget_rate(self) -> torch.Tensor:
        """g = forget_max · sigmoid(forget_logit), or 0 without forgetting."""
        if not self.config.forgetting:
            return self.forget_logit.new_zeros(())
        return self.config.forget_max * torch.sigmoid(self.forget_logit.float())

    def empty_state(self, batch_size: int, device: torch.device) -> NotebookState:
        F_ = self.config.hrr_dim // 2 + 1
        zeros = torch.zeros(batch_size, F_, dtype=torch.complex64, device=device)
        tail = torch.full((batch_size, self.tail_length), PAD_ID, dtype=torch.long, device=device)
        return NotebookState(zeros, zeros.clone(), tail)

    def keys(self, ids_with_tail: torch.Tensor, T: int) -> torch.Tensor:
        """Spectra of the normalised keys (1) for the last T positions: [B, T, F] complex."""
        spectra = self.spectra()
        W = self.config.key_window
        window_ids = ids_with_tail[:, -(W - 1 + T):]  # [B, W-1+T]
        terms = spectra["keys"][window_ids] * (window_ids != PAD_ID).unsqueeze(-1)  # [B, W-1+T, F]
        key = sum(spectra["roles"][j] * terms[:, W - 1 - j:W - 1 - j + T] for j in range(W))
        weights = parseval_weights(self.config.hrr_dim, key.device) / self.config.hrr_dim
        norm_sq = (weights * (key.real.square() + key.imag.square())).sum(-1, keepdim=True)
        return key / norm_sq.clamp_min(1e-30).sqrt()  # an all-padding window stays zero

    def trace(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor,
        state: NotebookState | None = None,
        write_mask: torch.Tensor | None = None,
    ) -> tuple[NotebookTrace, NotebookState]:
        """Keys, writes, β and keep factors for input_ids [B, T] (padding already set to the pad id).

        Returns the trace and the state with everything but the memory advanced (the scan does that).
        """
        B, T = input_ids.shape
        state = state if state is not None else self.empty_state(B, input_ids.device)
        ids_with_tail = torch.cat([state.tail, input_ids], dim=1)  # [B, L+T]
        with torch.no_grad():  # keys and writes depend on the fixed tables only
            keys = self.keys(ids_with_tail, T)
            prev_keys = torch.cat([state.prev_key.unsqueeze(1), keys[:, :-1]], dim=1)
            writes = prev_keys * self.spectra()["values"][input_ids] * self.binding_scale
        if write_mask is None:
            gate_ids = ids_with_tail[:, -(self.config.gate_window - 1 + T):]
            beta = torch.sigmoid(self.gate(gate_ids).float())
        else:
            beta = write_mask.float()
        beta = beta * valid
        keep = (1.0 - self.forget_rate() * beta).clamp_min(self.config.keep_clamp)
        advanced = NotebookState(state.memory, keys[:, -1], ids_with_tail[:, -self.tail_length:])
        return NotebookTrace(keys, writes, beta, keep), advanced

    def scan(
        self, trace: NotebookTrace, initial_state: torch.Tensor | None = None, output_final_state: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(3) for every position: memory spectra [B, T, F] and the last one [B, F]."""
        inputs = trace.beta.unsqueeze(-1) * trace.writes
        if not self.config.forgetting:
            return cumulative_sum_scan(inputs, initial_state, output_final_state)
        return linear_scan(trace.keep.unsqueeze(-1), inputs, initial_state, output_final_state, self.config.scan_chunk)

    def contribution(
        self, trace: NotebookTrace, span_mask: torch.Tensor, output_final_state: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the writes at span_mask [B, T] add to the memory, with every later forgetting factor
        applied: C_t = Σ_{u ≤ t, u in span} (Π_{u < v ≤ t} a_v) β_u w_u (SPEC §3, exact by linearity).
        Subtracting it from the memory unlearns the span."""
        return self.scan(dataclasses.replace(trace, beta=trace.beta * span_mask), None, output_final_state)

    def read(self, memory: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """(4)-(5) without the scale: ⟨mem ⊛† key_t, cv_b⟩ for every b. [B, T, F] x2 -> [B, T, V]."""
        unbound = memory * keys.conj() * self.binding_scale
        return torch.cat([unbound.real, unbound.imag], dim=-1) @ self.spectra()["read_table"]

    def forward(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor,
        state: NotebookState | None = None,
        write_mask: torch.Tensor | None = None,
        reference: bool = False,
    ) -> tuple[torch.Tensor, NotebookState]:
        """input_ids [B, T] (padding set to the pad id), valid [B, T] -> (logit bias [B, T, V], state).

        `write_mask` [B, T] replaces β (oracle gate). `reference=True` runs `notebook_reference`.
        """
        trace, advanced = self.trace(input_ids, valid, state, write_mask)
        if reference:
            reads, final = notebook_reference(
                input_ids, trace.beta, self.forget_rate(), self.key_codebook.float(), self.value_codebook.float(),
                self.roles.float(), self.config.fft_norm, self.config.keep_clamp,
                state if state is not None else self.empty_state(input_ids.shape[0], input_ids.device),
                output_final_state=True,
            )
            return self.read_scale * reads * valid.unsqueeze(-1), final
        memory, final_memory = self.scan(trace, None if state is None else state.memory, output_final_state=True)
        logits = self.read_scale * self.read(memory, trace.keys) * valid.unsqueeze(-1)
        return logits, NotebookState(final_memory, advanced.prev_key, advanced.tail)
