"""The notebook (SPEC §3): a fixed-key holographic associative memory that biases next-byte logits.

At position t, with x_t the byte at t, ⊛ circular convolution and ⊛† circular correlation:

    (1) key_t  = ℓ2( Σ_{j<7} role_j ⊛ ck[x_{t-j}] )             missing or padded bytes are left out
                 or, with key_binding "bind", the unit key of spectrum exp(2πi (Σ_j k_j ⊙ x_{t-j} mod P) / P):
                 a random integer k_{j,f} per slot and frequency, P prime, so each window gets its own key
    (2) β_t    = sigmoid(gate(x_{t-15..t}))                       or an oracle `write_mask`; with the
                 write_signal "surprise", sigmoid(a (S_t - c)) of the trunk's surprise S_t = -log p(x_t | x_<t)
    (3) mem    = (1 - g β_t) · mem + β_t · (key_{t-1} ⊛ cv[x_t])   no write at t = 0
    (4) r_t    = mem ⊛† key_t
    (5) logits_t = s · (cv @ r_t)                                  the bias for x_{t+1}

The fast path works on rfft spectra, where ⊛ is a product: a write is K_{t-1} ⊙ CV[x_t], the memory
is a linear scan over positions, and the read skips the inverse FFT by taking every ⟨r_t, cv_b⟩ from
the spectrum directly (Parseval): scan_read.py fuses scan and read, with its own reference;
`notebook_reference` here is the literal loop in time.
State (`NotebookState`) is the memory spectrum, the last token ids and (for surprise writes) the trunk's last
logits, constant in size; the previous key is a function of the last 7 ids, so it is recomputed from the
tail rather than stored.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from .activation import gelu
from .configuration_kathleen import PAD_ID, KathleenConfig
from .read_trust import ReadTrust
from .scan import cumulative_sum_scan, linear_scan
from .scan_read import Bindings, FourierReadOut, ReadOut, TableReadOut, compiled_kernels, interleaved, scan_and_read


@dataclass
class NotebookState:
    """The notebook after the bytes read so far (spectra are unnormalised rfft, F = R/2 + 1 bins)."""

    memory: torch.Tensor  # [B, F] complex64, spectrum of the memory vector
    tail: torch.Tensor  # [B, L] long, the last L token ids (pad where nothing or padding was read)
    # [B, V]: the trunk's logits at the last position read, its prediction of the next byte (surprise writes);
    # [B, 0] when β does not use surprise. Zeros (a uniform guess) before anything was read.
    last_logits: torch.Tensor


@dataclass
class NotebookTrace:
    """Everything the memory does at each position, recomputable from the bytes alone (SPEC §3)."""

    keys: torch.Tensor  # [B, T, F] complex, K_t
    writes: torch.Tensor  # [B, T, F] complex, w_t = K_{t-1} ⊙ CV[x_t] (times the binding scale)
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


def fourier_value_vectors(vocab: int, dim: int, period: int, generator: torch.Generator) -> torch.Tensor:
    """SPEC §8.1: row b has spectrum exp(2πi k_f b / N), one random k_f in [0, N) per frequency, N = period
    ≥ vocab. Rows a ≠ b are as nearly orthogonal for any such N (|a - b| < N). Values only."""
    k = torch.randint(0, period, (dim // 2 + 1,), generator=generator, dtype=torch.float64)
    b = torch.arange(vocab, dtype=torch.float64).unsqueeze(1)
    spectrum = torch.polar(torch.ones(vocab, k.numel(), dtype=torch.float64), 2 * math.pi * k * b / period)
    spectrum[:, 0] = 1.0
    spectrum[:, -1] = 1.0
    return torch.fft.irfft(spectrum, n=dim)


PIECE_ELEMENTS = 1 << 22  # positions x frequencies of keys formed at once: 32 MiB of complex64 per sequence
# bound keys' phases are multiples of 2π / Q, looked up in a table of the Q roots of unity (no sine or cosine per
# key). Two windows whose bytes differ by d ≠ 0 in a slot differ there by k·d mod Q, uniform over a subgroup of at
# least Q / 256 points for random k: mean zero, so their keys are as nearly orthogonal as random phases make them.
KEY_TURNS = 2**16


def integer_frequencies(rows: int, bins: int, high: int, generator: torch.Generator) -> torch.Tensor:
    """[rows, bins] random integers in [0, high), 0 at DC and Nyquist (a real signal's spectrum is real there)."""
    k = torch.randint(0, high, (rows, bins), generator=generator)
    k[:, 0] = 0
    k[:, -1] = 0
    return k


def make_codebooks(config: KathleenConfig) -> dict[str, torch.Tensor]:
    """The fixed tables, drawn from `config.key_seed` alone. Bundled keys: key table CK [V, R], value table
    CV [V, R] and roles [W, R]. Bound keys (SPEC §10) are generated by integers, so R can be large without large
    tables: key frequencies k [W, F] (slot j, frequency f) and the Fourier value table's k_f [F]."""
    generator = torch.Generator().manual_seed(config.key_seed)
    V, R = config.vocab_size, config.hrr_dim
    if config.key_binding == "bind":
        return {"key_frequencies": integer_frequencies(config.key_window, R // 2 + 1, KEY_TURNS, generator),
                "value_frequencies": integer_frequencies(1, R // 2 + 1, config.fourier_period, generator)[0]}
    keys = gaussian_unit_vectors(V, R, generator)
    roles = unitary_vectors(config.key_window, R, generator)
    if config.value_codebook == "shared":
        values = keys.clone()
    elif config.value_codebook == "gaussian":
        values = gaussian_unit_vectors(V, R, generator)
    else:
        values = fourier_value_vectors(V, R, config.fourier_period, generator)
    return {"key_codebook": keys.float(), "value_codebook": values.float(), "roles": roles.float()}


def roots_of_unity(n: int, device: torch.device | None = None) -> torch.Tensor:
    """[n] complex64: exp(2πi m / n) for m = 0 .. n-1 (computed in float64)."""
    turns = torch.arange(n, dtype=torch.float64, device=device) / n
    return torch.polar(torch.ones_like(turns), 2 * math.pi * turns).to(torch.complex64)


def bound_key_spectra(windows: torch.Tensor, key_frequencies: torch.Tensor) -> torch.Tensor:
    """Bound keys [..., F] complex64 of windows [..., W] (token ids, the newest last; pad id 0 adds nothing):
    exp(2πi (Σ_j k_{j,f} x_{t-j} mod Q) / Q). A sum of integers, so the product of the slots' unit spectra is
    exact, and slot j's frequencies differ from slot i's: a window and its anagrams get different keys."""
    newest_first = key_frequencies.flip(0).double()  # row i of the window (oldest first) is slot W-1-i
    turns = torch.remainder(windows.double() @ newest_first, KEY_TURNS).long()  # exact: sums stay below 2^53
    return roots_of_unity(KEY_TURNS, windows.device)[turns]


def fourier_value_spectra(value_frequencies: torch.Tensor, vocab: int, period: int) -> torch.Tensor:
    """[V, F] complex64: row b is exp(2πi k_f b / N), the Fourier value table of SPEC §8.1 from its k_f."""
    turns = torch.arange(vocab, dtype=torch.float64, device=value_frequencies.device).unsqueeze(1) \
        * value_frequencies.double() / period
    return torch.polar(torch.ones_like(turns), 2 * math.pi * turns).to(torch.complex64)


def parseval_weights(R: int, device: torch.device) -> torch.Tensor:
    """m_f [F] so that ⟨x, y⟩ = Σ_f m_f Re(X_f conj(Y_f)) / R for real x, y of length R."""
    m = torch.full((R // 2 + 1,), 2.0, device=device)
    m[0] = 1.0
    m[-1] = 1.0
    return m


def fourier_frequencies(row_one: torch.Tensor, period: int) -> torch.Tensor:
    """k_f [F] long from the spectrum of the Fourier value table's row 1, exp(2πi k_f / N).

    Raises a ValueError when the phases are not multiples of 2π / N: a table stored in a checkpoint
    that was built with another period than the config says."""
    turns = torch.angle(row_one.to(torch.complex128)) / (2 * math.pi) * period
    off_grid = 0.0 if turns.is_meta else float((turns - torch.round(turns)).abs().max())  # meta: shapes only
    if off_grid > 1e-2:
        raise ValueError(f"the Fourier value codebook does not have period fourier_period={period} (phases off "
                         f"the grid by {off_grid:.2f} steps): the config and the stored table disagree")
    return torch.round(turns).long() % period


# ---- the literal reference -------------------------------------------------------------------


def notebook_reference(
    input_ids: torch.Tensor,
    beta: torch.Tensor,
    forget_rate: torch.Tensor | float,
    key_codebook: torch.Tensor | None,
    value_codebook: torch.Tensor,
    roles: torch.Tensor | None,
    fft_norm: str = "backward",
    keep_clamp: float = 0.75,
    key_frequencies: torch.Tensor | None = None,
    initial_state: NotebookState | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, NotebookState | None]:
    """Equations (1)-(5) one byte at a time in the time domain, fp32: the oracle for `Notebook`.

    input_ids [B, T] (padding already replaced by the pad id), beta [B, T] -> raw reads cv @ r_t
    [B, T, V] (before the read scale s) and the final state (its last_logits left as the initial state's:
    β is an input here). The state's tail supplies the bytes before t = 0; pad ids stand for "nothing
    there", so their key terms are left out (a window of padding only has the zero key). Bound keys: pass
    key_frequencies [W, F] instead of key_codebook and roles.
    """
    B, T = input_ids.shape
    V, R = value_codebook.shape
    bound = key_frequencies is not None
    W = key_frequencies.shape[0] if bound else roles.shape[0]

    def rfft(x):
        return torch.fft.rfft(x, norm=fft_norm)

    def irfft(x):
        return torch.fft.irfft(x, n=R, norm=fft_norm)

    def cconv(a, b):
        return irfft(rfft(a) * rfft(b))

    def ccorr(a, b):
        return irfft(rfft(a) * rfft(b).conj())

    if initial_state is None:
        history = torch.full((B, W), PAD_ID, dtype=torch.long, device=input_ids.device)
        mem = value_codebook.new_zeros(B, R)
        last_logits = value_codebook.new_zeros(B, 0)
    else:
        last_logits = initial_state.last_logits
        history = initial_state.tail
        mem = torch.fft.irfft(initial_state.memory, n=R)
    ids = torch.cat([history, input_ids], dim=1)

    def key_at(i: int) -> torch.Tensor:  # (1) for the position at column i of ids
        window = ids[:, i - W + 1:i + 1]  # [B, W], oldest first
        any_present = (window != PAD_ID).any(dim=1, keepdim=True).to(value_codebook.dtype)
        if bound:
            key = torch.fft.irfft(bound_key_spectra(window, key_frequencies).to(torch.complex128), n=R)
        else:
            key = value_codebook.new_zeros(B, R)
            for j in range(W):
                byte = ids[:, i - j]
                present = (byte != PAD_ID).to(key.dtype).unsqueeze(1)
                key = key + present * cconv(roles[j].expand(B, R), key_codebook[byte])
        key = key.to(value_codebook.dtype) * any_present
        norm = key.norm(dim=1, keepdim=True)
        return torch.where(norm > 0, key / norm.clamp_min(1e-30), 0.0)

    prev_key, reads = key_at(history.shape[1] - 1), []
    for t in range(T):
        i = history.shape[1] + t
        key = key_at(i)
        b = beta[:, t].unsqueeze(1)
        keep = (1.0 - forget_rate * b).clamp_min(keep_clamp)
        mem = keep * mem + b * cconv(prev_key, value_codebook[ids[:, i]])  # (3)
        reads.append(ccorr(mem, key) @ value_codebook.T)  # (4), (5) without s
        prev_key = key
    final = None
    if output_final_state:
        final = NotebookState(torch.fft.rfft(mem).to(torch.complex64), ids[:, -history.shape[1]:], last_logits)
    return torch.stack(reads, dim=1), final


# ---- the trunk's surprise (write_signal "surprise") ------------------------------------------------


def trunk_surprise(
    input_ids: torch.Tensor, trunk_logits: torch.Tensor, last_logits: torch.Tensor, valid: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """S_t = -log softmax(prediction of x_t)[x_t] in nats, detached: the trunk's surprise at each new byte.

    input_ids [B, T]; trunk_logits [B, T, V] (row t predicts x_{t+1}); last_logits [B, V], the prediction made
    before this call. A byte after padding is scored by the prediction of the last real position before it.
    Returns surprise [B, T] (meaningless at padding, where nothing is written) and the new last_logits [B, V].
    """
    B, T = input_ids.shape
    logits = torch.cat([last_logits.unsqueeze(1), trunk_logits.detach().float()], dim=1)  # [B, T+1, V]
    rows = torch.arange(1, T + 1, device=input_ids.device).expand(B, T)  # row t+1 of logits is position t's
    if valid is not None:
        rows = torch.where(valid, rows, 0)
    latest = rows.cummax(dim=1).values  # [B, T]: the row of the last real position up to t (0: before the call)
    source = torch.cat([latest.new_zeros(B, 1), latest[:, :-1]], dim=1)  # the row that predicted x_t
    batch = torch.arange(B, device=input_ids.device).unsqueeze(1)
    surprise = torch.logsumexp(logits, dim=-1).gather(1, source) - logits[batch, source, input_ids]
    return surprise, logits[batch[:, 0], latest[:, -1]]


# ---- the trainable module --------------------------------------------------------------------


class TableRowSum(torch.autograd.Function):
    """Σ_j table[rows[:, j]] for rows [N, J] -> [N, E]: `F.embedding_bag`'s sum forward, with a backward of
    one `index_add_` per column of rows (several times faster on a CPU than embedding_bag's own backward)."""

    @staticmethod
    def forward(ctx, table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows)
        ctx.table_rows = table.shape[0]
        return F.embedding_bag(rows, table, mode="sum")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (rows,) = ctx.saved_tensors
        grad_table = grad.new_zeros(ctx.table_rows, grad.shape[1])
        for column in rows.T.contiguous():
            grad_table.index_add_(0, column, grad)
        return grad_table, None


class WriteGate(nn.Module):
    """β's logit from the last `gate_window` bytes only: no trunk state, no position (SPEC §3).

    Its convolution over the gate's byte embedding E is Σ_j W_j E[x_{t+j}] over the window's taps j, so a
    sequence reads it as a sum of rows of the tap table W_j E [window·V, E] (`TableRowSum`): one embedding-bag
    sum instead of a convolution, and no convolution backward, which was most of the gate's cost in a training
    step on a CPU. `forward_reference` runs the convolution itself.
    """

    def __init__(self, config: KathleenConfig):
        super().__init__()
        e = config.gate_embed_dim
        self.window = config.gate_window
        self.embed = nn.Embedding(config.vocab_size, e, padding_idx=PAD_ID)  # padding reads as nothing
        self.conv = nn.Conv1d(e, e, config.gate_window)
        self.out = nn.Linear(e, 1)

    def forward(self, ids_with_tail: torch.Tensor) -> torch.Tensor:
        """ids_with_tail [B, window-1+T] -> logits [B, T]. An embedding or convolution that is more than its
        weights (a LoRA layer in its place, a hook on it) runs as itself, through `forward_reference`."""
        if any(type(m) not in (nn.Embedding, nn.Conv1d) or m._forward_hooks or m._forward_pre_hooks
               for m in (self.embed, self.conv)):
            return self.forward_reference(ids_with_tail)
        if ids_with_tail.shape[1] == self.window:  # one decoding step: the convolution is one matrix product
            e = self.embed(ids_with_tail).transpose(1, 2).flatten(1)  # [B, E·window], channel-major
            return self.out(gelu(F.linear(e, self.conv.weight.flatten(1), self.conv.bias)))  # [B, 1]
        B, V = ids_with_tail.shape[0], self.embed.num_embeddings
        rows = ids_with_tail.unfold(1, self.window, 1) + torch.arange(self.window, device=ids_with_tail.device) * V
        summed = TableRowSum.apply(self.tap_table(), rows.reshape(-1, self.window))
        hidden = gelu(summed.view(B, -1, summed.shape[-1]) + self.conv.bias)  # [B, T, E]
        return self.out(hidden).squeeze(-1)

    def tap_table(self) -> torch.Tensor:
        """[window·V, E]: row j·V + v is W_j E[v], the convolution's tap j applied to byte v. The padding row
        of E gets no gradient through it, as through nn.Embedding's padding_idx."""
        embed = self.embed.weight
        pad = torch.arange(embed.shape[0], device=embed.device).unsqueeze(1) == self.embed.padding_idx
        embed = torch.where(pad, embed.detach(), embed)
        return torch.einsum("oik,vi->kvo", self.conv.weight, embed).flatten(0, 1)

    def forward_reference(self, ids_with_tail: torch.Tensor) -> torch.Tensor:
        """The literal convolution over the embedded window: the oracle for `forward`."""
        hidden = F.gelu(self.conv(self.embed(ids_with_tail).transpose(1, 2))).transpose(1, 2)
        return self.out(hidden).squeeze(-1)


@dataclass(frozen=True)
class NotebookSettings:
    """The config fields the notebook uses at run time, as plain attributes (a Transformers config's
    attribute access is slow enough to show up in per-byte decoding)."""

    vocab_size: int
    hrr_dim: int
    key_window: int
    gate_window: int
    fft_norm: str
    value_codebook: str
    fourier_period: int
    key_binding: str
    write_signal: str
    uses_gate: bool
    uses_surprise: bool
    forgetting: bool
    forget_max: float
    keep_clamp: float
    scan_chunk: int

    @classmethod
    def from_config(cls, config: KathleenConfig) -> NotebookSettings:
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


class Notebook(nn.Module):
    """Keys, gate, write, scan and read of SPEC §3, with explicit state in and out."""

    def __init__(self, config: KathleenConfig):
        super().__init__()
        self.config = NotebookSettings.from_config(config)
        self.tail_length = config.tail_length
        for name, table in make_codebooks(config).items():
            self.register_buffer(name, table, persistent=True)  # stored: a non-persistent buffer is lost
        self.gate = WriteGate(config) if config.uses_gate else None
        if config.uses_surprise:  # β's logit gains a · (S - c)
            self.surprise_scale = nn.Parameter(torch.tensor(float(config.surprise_scale_init)))
            self.surprise_shift = nn.Parameter(torch.tensor(float(config.surprise_shift_init)))
        self.read_scale = nn.Parameter(torch.tensor(config.effective_read_scale_init))
        self.forget_logit = nn.Parameter(torch.tensor(config.forget_logit_init))
        self.trust = ReadTrust() if config.read_trust else None
        self._spectra_key = None
        self._spectra = None

    def _apply(self, fn, recurse: bool = True):
        """`.to(dtype)`, `.half()` and the like move the fixed tables but never cast them: their phases must stay
        on the grid of 2π / N (a bf16 table is off it), and the memory is fp32 whatever the weights are."""
        tables = {name: self._buffers.pop(name) for name in list(self._buffers)}
        try:
            super()._apply(fn, recurse)
        finally:
            for name, table in tables.items():
                self._buffers[name] = table.to(fn(table.new_empty(0)).device)
        return self

    def spectra(self) -> dict[str, torch.Tensor | ReadOut]:
        """Fixed tables derived from the buffers, recomputed only when a buffer changes (load, .to())."""
        tables = list(self._buffers.values())  # checked per call
        key = tuple(b.data_ptr() for b in tables) + tuple(b._version for b in tables)  # .to() moves data_ptr
        if key != self._spectra_key and self.config.key_binding == "bind":
            self._spectra = self.bound_spectra()
            self._spectra_key = key
        if key != self._spectra_key:
            R, W = self.config.hrr_dim, self.config.key_window
            keys = torch.fft.rfft(self.key_codebook.float())  # [V, F]
            values = torch.fft.rfft(self.value_codebook.float())  # [V, F]
            roles = torch.fft.rfft(self.roles.float())  # [W, F]
            m = parseval_weights(R, values.device) / R
            # row j·V + v is role_j ⊛ ck[v], and zero for the pad id: a pad byte adds nothing to a key
            role_terms = interleaved(roles.unsqueeze(1) * keys.unsqueeze(0))  # [W, V, 2F]
            role_terms[:, PAD_ID] = 0.0
            V = keys.shape[0]
            self._spectra = {
                "write_values": values * self.binding_scale,  # CV as a write binds it
                "role_terms": role_terms.flatten(0, 1),
                # ⟨M ⊙ conj(K), cv_b⟩ = interleaved(M ⊙ conj(K)) @ read_table[:, b]
                "read_table": interleaved(m * values).T.contiguous() * self.binding_scale,  # [2F, V]
                # the key window's newest byte is last: slot j = W-1-i of the role table holds x_{t-j}
                "row_offsets": torch.arange(W - 1, -1, -1, device=values.device) * keys.shape[0],
            }
            if self.config.value_codebook == "fourier":
                frequencies = fourier_frequencies(values[1], self.config.fourier_period)
                gain = 2.0 / R * self.binding_scale  # the Parseval weight of every frequency but DC and Nyquist
                self._spectra["reader"] = FourierReadOut(frequencies, self.config.fourier_period, V, gain)
            else:
                self._spectra["reader"] = TableReadOut(self._spectra["read_table"])
            self._spectra_key = key
        return self._spectra

    def bound_spectra(self) -> dict[str, torch.Tensor | ReadOut]:
        """The tables of bound keys: the Fourier value spectra from their k_f, its read-out, the key frequencies."""
        R, V, N = self.config.hrr_dim, self.config.vocab_size, self.config.fourier_period
        values = fourier_value_spectra(self.value_frequencies, V, N) * self.binding_scale  # [V, F]
        W = self.config.key_window
        ids = torch.arange(V, dtype=torch.float64, device=values.device)
        # row (W-1-j)·V + v: byte v's turns in slot j, k_{j,f} v mod Q, so that a key is one embedding-bag sum of
        # W rows (the window's newest byte last, as for bundled keys) and one table look-up; the sums are integers
        # below 2^24, exact in float32
        turns = torch.remainder(ids[None, :, None] * self.key_frequencies.flip(0).double()[:, None], KEY_TURNS)
        return {"write_values": values, "key_turns": turns.float().flatten(0, 1),
                "roots": roots_of_unity(KEY_TURNS, values.device),
                "row_offsets": torch.arange(W, device=values.device) * V,
                "reader": FourierReadOut(self.value_frequencies, N, V, 2.0 / R * self.binding_scale)}

    def dense_value_codebook(self) -> torch.Tensor:
        """CV [V, R] in the time domain (the references work on vectors)."""
        if self.config.key_binding == "bind":
            spectra = fourier_value_spectra(self.value_frequencies, self.config.vocab_size, self.config.fourier_period)
            return torch.fft.irfft(spectra.to(torch.complex128), n=self.config.hrr_dim).float()
        return self.value_codebook.float()

    @property
    def binding_scale(self) -> float:
        """Each "ortho" binding or unbinding divides by sqrt(R); "backward" is the true convolution."""
        return 1.0 / math.sqrt(self.config.hrr_dim) if self.config.fft_norm == "ortho" else 1.0

    def forget_rate(self) -> torch.Tensor:
        """g = forget_max · sigmoid(forget_logit), or 0 without forgetting."""
        if not self.config.forgetting:
            return self.forget_logit.new_zeros(())
        return self.config.forget_max * torch.sigmoid(self.forget_logit.float())

    def keep_factors(self, beta: torch.Tensor) -> torch.Tensor:
        """a = 1 - g β, clamped below at keep_clamp (1/Π a must stay finite within a scan chunk)."""
        return (1.0 - self.forget_rate() * beta).clamp_min(self.config.keep_clamp)

    def empty_state(self, batch_size: int, device: torch.device) -> NotebookState:
        memory = torch.zeros(batch_size, self.config.hrr_dim // 2 + 1, dtype=torch.complex64, device=device)
        tail = torch.full((batch_size, self.tail_length), PAD_ID, dtype=torch.long, device=device)
        last_logits = torch.zeros(batch_size, self.config.vocab_size if self.config.uses_surprise else 0, device=device)
        return NotebookState(memory, tail, last_logits)

    def bindings(self, ids_with_tail: torch.Tensor, n_new: int) -> Bindings:
        """The keys (1) of the last n_new + 1 positions of ids_with_tail (the one before the new ids too: it
        binds the first new value) and the new ids as values.

        Each key is one embedding-bag sum of W rows of the role ⊛ codebook table (bundled: of their spectra;
        bound: of their phases); its 1/‖k‖ stays a separate number per position (`Bindings.key_scales`), which
        the scan folds into its coefficients.
        """
        spectra = self.spectra()
        W, R = self.config.key_window, self.config.hrr_dim
        windows = ids_with_tail[:, -(W + n_new):].unfold(1, W, 1)  # [B, n_new + 1, W], the newest byte last
        B = windows.shape[0]
        values = ids_with_tail[:, -n_new:]
        if self.config.key_binding == "bind":  # `bound_key_spectra` by a table: unit modulus, so ‖k‖ = 1
            rows = windows + spectra["row_offsets"]
            turns = F.embedding_bag(rows.reshape(-1, W), spectra["key_turns"], mode="sum")  # [B·(n+1), F]
            keys = spectra["roots"][turns.long().bitwise_and_(KEY_TURNS - 1)].view(B, n_new + 1, -1)
            scales = (windows != PAD_ID).any(-1).float()  # a window of padding: zero key
            return Bindings(keys, scales, values, spectra["write_values"])
        rows = windows + spectra["row_offsets"]
        key = F.embedding_bag(rows.reshape(-1, W), spectra["role_terms"], mode="sum")  # [B·(n+1), 2F] re/im
        # ‖k‖² = Σ_f m_f |K_f|² / R (Parseval: m = 2, but 1 at DC and Nyquist, whose imaginary parts are 0):
        # one read of the keys, no [B·n, 2F] temporary
        edges = key[:, ::key.shape[1] - 2]  # the real parts of DC and Nyquist
        squared = torch.linalg.vector_norm(key, dim=-1).square().mul(2 / R).sub(edges.square().sum(-1), alpha=1 / R)
        scales = torch.where(squared > 0, squared.clamp_min(1e-30).rsqrt(), 0.0)  # a window of padding: zero key
        keys = torch.view_as_complex(key.reshape(B, n_new + 1, -1, 2))
        return Bindings(keys, scales.reshape(B, n_new + 1), values, spectra["write_values"])

    def with_tail(self, input_ids: torch.Tensor, state: NotebookState | None) -> torch.Tensor:
        """[B, L+T]: the ids the state remembers (pads when there is none), then input_ids [B, T]."""
        state = state if state is not None else self.empty_state(input_ids.shape[0], input_ids.device)
        return torch.cat([state.tail, input_ids], dim=1)

    def write_strengths(
        self,
        ids_with_tail: torch.Tensor,
        n_new: int,
        valid: torch.Tensor | None,
        write_mask: torch.Tensor | None = None,
        surprise: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """β [B, T] for the last T = n_new ids of ids_with_tail (the state's tail before them): sigmoid of the
        gate's logit and/or a · (surprise [B, T] - c) (write_signal), or write_mask's where one is given; 0 at
        padding (valid None: no padding)."""
        if write_mask is not None:
            beta = write_mask.float()
        else:
            logit = 0.0
            if self.gate is not None:
                logit = self.gate(ids_with_tail[:, -(self.config.gate_window - 1 + n_new):]).float()
            if self.config.uses_surprise:
                if surprise is None:
                    raise ValueError("this notebook writes by the trunk's surprise: pass trunk_logits")
                logit = logit + self.surprise_scale * (surprise - self.surprise_shift)
            beta = torch.sigmoid(logit)
        return beta if valid is None else beta * valid

    def trace(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor | None,
        state: NotebookState | None = None,
        write_mask: torch.Tensor | None = None,
        trunk_logits: torch.Tensor | None = None,
    ) -> tuple[NotebookTrace, NotebookState]:
        """Keys, writes, β and keep factors for input_ids [B, T] (padding already set to the pad id).

        Returns the trace and the new state without its memory (memory None: the scan advances that).
        """
        bindings, beta, keep, after = self.inputs(input_ids, valid, state, write_mask, trunk_logits)
        with torch.no_grad():  # keys and writes depend on the fixed tables only
            trace = NotebookTrace(bindings.normalised_keys(), bindings.writes(), beta, keep)
        return trace, after

    def inputs(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor | None,
        state: NotebookState | None,
        write_mask: torch.Tensor | None,
        trunk_logits: torch.Tensor | None = None,
    ) -> tuple[Bindings, torch.Tensor, torch.Tensor, NotebookState]:
        """What the scan needs for input_ids [B, T]: bindings, β [B, T], keep factors [B, T], and the new state
        without its memory (tail and last logits; memory None)."""
        ids_with_tail, beta, after = self.write_inputs(input_ids, valid, state, write_mask, trunk_logits)
        with torch.no_grad():
            bindings = self.bindings(ids_with_tail, input_ids.shape[1])
        return bindings, beta, self.keep_factors(beta), after

    def write_inputs(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor | None,
        state: NotebookState | None,
        write_mask: torch.Tensor | None,
        trunk_logits: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, NotebookState]:
        """The ids with the state's tail before them [B, L+T], β [B, T] (gate and/or the trunk's surprise, or
        write_mask), and the new state without its memory."""
        state = state if state is not None else self.empty_state(input_ids.shape[0], input_ids.device)
        ids_with_tail = self.with_tail(input_ids, state)
        surprise, last_logits = None, state.last_logits  # without trunk_logits the last logits stay as they were
        if self.config.uses_surprise and (trunk_logits is not None or write_mask is None):
            if trunk_logits is None:
                raise ValueError("this notebook writes by the trunk's surprise: pass trunk_logits [B, T, V]")
            surprise, last_logits = trunk_surprise(input_ids, trunk_logits, state.last_logits, valid)
        beta = self.write_strengths(ids_with_tail, input_ids.shape[1], valid, write_mask, surprise)
        return ids_with_tail, beta, NotebookState(None, ids_with_tail[:, -self.tail_length:], last_logits)

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

    @property
    def reader(self) -> ReadOut:
        """⟨u, cv_b⟩ for every b of a spectrum u: the Fourier read for the Fourier codebook, the table read
        otherwise."""
        return self.spectra()["reader"]

    def trusted(self, reads: torch.Tensor, trunk_logits: torch.Tensor) -> torch.Tensor:
        """reads [..., V] with the read trust's extra nats (read_trust.py) where the config has one; the trunk's
        logits broadcast to reads' shape."""
        return reads if self.trust is None else self.trust(reads, trunk_logits)

    def read(self, memory: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """(4)-(5) without the scale: ⟨mem ⊛† key_t, cv_b⟩ for every b. [B, T, F] x2 -> [B, T, V]."""
        return self.reader(memory * keys.conj())

    def forward(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor | None,
        state: NotebookState | None = None,
        write_mask: torch.Tensor | None = None,
        reference: bool = False,
        first_read: int = 0,
        trunk_logits: torch.Tensor | None = None,
        output_write_strengths: bool = False,
    ) -> tuple[torch.Tensor, NotebookState] | tuple[torch.Tensor, NotebookState, torch.Tensor]:
        """input_ids [B, T] (padding set to the pad id), valid [B, T] or None (no padding) -> (logit bias
        [B, T - first_read, V] of the positions from first_read on, state), and β [B, T] when
        `output_write_strengths` (a write budget penalises it in training).

        `write_mask` [B, T] replaces β (oracle gate). trunk_logits [B, T, V] are needed when β uses the trunk's
        surprise. `reference=True` runs `notebook_reference`. One byte without padding or autograd (decoding)
        goes to `compiled_step` where kernels.py's kernels apply (bundled keys: the kernel sums their spectra).
        """
        state = state if state is not None else self.empty_state(input_ids.shape[0], input_ids.device)
        piece = max(self.config.scan_chunk, PIECE_ELEMENTS // (self.config.hrr_dim // 2 + 1))
        if input_ids.shape[1] > piece and not reference:  # keys of a long input at a large R: piece by piece
            reads, final, beta = self.forward_in_pieces(piece, input_ids, valid, state, write_mask, first_read,
                                                        trunk_logits)
            return (reads, final, beta) if output_write_strengths else (reads, final)
        if (input_ids.shape[1] == 1 and valid is None and not reference and not torch.is_grad_enabled()
                and self.config.key_binding == "bundle"):
            spectra = self.spectra()
            kernels = compiled_kernels(spectra["reader"], state.memory, spectra["write_values"])
            if kernels is not None:  # a decoded byte: one compiled call (kernels.py)
                reads, final, beta = self.compiled_step(kernels, spectra, input_ids, state, write_mask, trunk_logits)
                return (reads, final, beta) if output_write_strengths else (reads, final)
        bindings, beta, keep, after = self.inputs(input_ids, valid, state, write_mask, trunk_logits)
        if reference:
            bound = self.config.key_binding == "bind"
            reads, final = notebook_reference(
                input_ids, beta, self.forget_rate(), None if bound else self.key_codebook.float(),
                self.dense_value_codebook(), None if bound else self.roles.float(), self.config.fft_norm,
                self.config.keep_clamp, self.key_frequencies if bound else None, state, output_final_state=True,
            )
            reads = self.masked_read(reads[:, first_read:], valid, first_read)
            final = dataclasses.replace(final, last_logits=after.last_logits)
        else:
            B, T = input_ids.shape  # the read scale s, 0 at padding, weighs each position's read inside the scan
            weights = self.read_scale.expand(B, T) if valid is None else self.read_scale * valid
            reads, memory = scan_and_read(bindings, beta, keep if self.config.forgetting else None, self.reader,
                                          state.memory, output_final_state=True, chunk_size=self.config.scan_chunk,
                                          first_read=first_read, read_weights=weights)
            final = dataclasses.replace(after, memory=memory)
        return (reads, final, beta) if output_write_strengths else (reads, final)

    def forward_in_pieces(
        self,
        piece: int,
        input_ids: torch.Tensor,
        valid: torch.Tensor | None,
        state: NotebookState,
        write_mask: torch.Tensor | None,
        first_read: int,
        trunk_logits: torch.Tensor | None,
    ) -> tuple[torch.Tensor, NotebookState, torch.Tensor]:
        """`forward` over consecutive pieces of `piece` positions, the state carried (equal by the recurrence;
        tested): the [B, T, F] keys of a long input at a large R would not fit in memory at once."""
        reads, betas = [], []
        for start in range(0, input_ids.shape[1], piece):
            part = slice(start, start + piece)
            length = input_ids[:, part].shape[1]
            read_from = min(max(first_read - start, 0), length - 1)  # a piece before first_read reads its end only
            read, state, beta = self(
                input_ids[:, part], None if valid is None else valid[:, part], state,
                None if write_mask is None else write_mask[:, part], first_read=read_from,
                trunk_logits=None if trunk_logits is None else trunk_logits[:, part], output_write_strengths=True)
            if start + length > first_read:
                reads.append(read[:, max(first_read - start - read_from, 0):])
            betas.append(beta)
        return torch.cat(reads, dim=1), state, torch.cat(betas, dim=1)

    def compiled_step(
        self,
        kernels: ModuleType,
        spectra: dict[str, torch.Tensor | ReadOut],
        input_ids: torch.Tensor,
        state: NotebookState,
        write_mask: torch.Tensor | None,
        trunk_logits: torch.Tensor | None,
    ) -> tuple[torch.Tensor, NotebookState, torch.Tensor]:
        """`forward` for one byte per sequence [B, 1] without padding or autograd, by kernels.py's `notebook_step`:
        β and the keep factor here, bundled keys, write and the read's bins there; returns reads, state, β. Its
        oracle is `forward`'s own one-step path (the tests compare them over a decoded sequence)."""
        reader, W = spectra["reader"], self.config.key_window
        ids_with_tail, beta, after = self.write_inputs(input_ids, None, state, write_mask, trunk_logits)  # β [B, 1]
        keep = self.keep_factors(beta) if self.config.forgetting else beta[:0]  # empty: no forgetting
        bins, memory, scales = kernels.notebook_step(
            spectra["role_terms"], spectra["row_offsets"], ids_with_tail[:, -(W + 1):], spectra["write_values"],
            state.memory, beta.view(-1), keep.view(-1), reader.frequencies, reader.period)
        reads = reader.read_bins(bins) * (scales * self.read_scale).unsqueeze(-1)  # [B, V]
        return reads.unsqueeze(1), dataclasses.replace(after, memory=memory), beta

    def masked_read(self, reads: torch.Tensor, valid: torch.Tensor | None, first_read: int = 0) -> torch.Tensor:
        """s · reads of the positions from first_read on, zero at padding."""
        if valid is None:
            return self.read_scale * reads
        return self.read_scale * reads * valid[:, first_read:].unsqueeze(-1)
