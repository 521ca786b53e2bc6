"""The notebook (SPEC §3): a fixed-key holographic associative memory that biases next-byte logits.

At position t, with x_t the byte at t, ⊛ circular convolution and ⊛† circular correlation:

    (1) key_t  = ℓ2( Σ_{j<W} role_j ⊛ ck[x_{t-j}] )             W = key_window bytes; missing or padded bytes
                 or, with key_binding "bind", the unit key of        are left out
                 spectrum exp(2πi (Σ_j k_j ⊙ x_{t-j} mod Q) / Q): a random integer k_{j,f} per slot and
                 frequency, Q = 2^16, so each window gets its own key
    (2) β_t    = sigmoid(gate(x_{t-15..t}))                       or an oracle `write_mask`; with the
                 write_signal "surprise", sigmoid(a (S_t - c)) of the trunk's surprise S_t = -log p(x_t | x_<t)
    (3) mem    = (1 - g β_t) · mem + β_t · (key_{t-1} ⊛ cv[x_t])   no write at t = 0
    (4) r_t    = mem ⊛† key_t
    (5) logits_t = s · (cv @ r_t)                                  the bias for x_{t+1}

This module holds what is trained, (2) and the scalars s and g, and the state; the fixed tables and the keys they
make are in codebooks.py, and (1), (3)-(5) are one operation in scan_read.py (a reference, a chunked and a
one-step form behind one dispatcher). `Notebook.forward`: state and bytes in -> β and keep factors ->
`scan_and_read` -> logit bias and state out. A fact bank (config.fact_bank, issue 18's two-bank arm) is a
second memory written with β_f = sigmoid(ℓ_t - d) of β's logit ℓ_t, never forgotten, its read added to the first's.
A repeat bank (config.repeat_key_window = W' < W) is a second memory written and forgotten like the first but keyed
by the last W' bytes only, its read added too: long keys keep facts apart, short ones find repeats. With
config.repeat_read_trust each of the two reads passes a read trust of its own before they are added (`combine`,
`trusted`).
State (`NotebookState`) is the memory spectrum, the last token ids, (for surprise writes) the trunk's last
logits and (with a fact or repeat bank) that bank's spectrum, constant in size; the previous key is a function of
the last W ids, so it is recomputed from the tail rather than stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .activation import gelu
from .codebooks import NotebookTables, make_codebooks, make_tables
from .configuration_kathleen import PAD_ID, KathleenConfig, NotebookSettings
from .read_trust import ReadTrust
from .scan import last_real_rows
from .scan_read import scan_and_read


@dataclass
class NotebookState:
    """The notebook after the bytes read so far."""

    spectrum: torch.Tensor  # [B, F] complex64: the memory, as the unnormalised rfft of its vector (F = R/2 + 1)
    tail: torch.Tensor  # [B, L] long, the last L token ids (pad where nothing or padding was read)
    # [B, V]: the trunk's logits at the last position read, its prediction of the next byte (surprise writes);
    # [B, 0] when β does not use surprise. Zeros (a uniform guess) before anything was read.
    last_logits: torch.Tensor
    # [B, F] complex64: the fact bank's memory (config.fact_bank), written like `spectrum` but never forgotten;
    # [B, 0] without a fact bank
    fact_spectrum: torch.Tensor
    # [B, F] complex64: the repeat bank's memory (config.repeat_key_window), written like `spectrum` with short keys;
    # [B, 0] without a repeat bank
    repeat_spectrum: torch.Tensor


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
    latest = last_real_rows(valid, B, T, input_ids.device)  # row t+1 of logits is position t's; 0: before the call
    source = torch.cat([latest.new_zeros(B, 1), latest[:, :-1]], dim=1)  # the row that predicted x_t
    batch = torch.arange(B, device=input_ids.device).unsqueeze(1)
    surprise = torch.logsumexp(logits, dim=-1).gather(1, source) - logits[batch, source, input_ids]
    return surprise, logits[batch[:, 0], latest[:, -1]]


@dataclass
class Bank:
    """One memory written with β and the notebook's forgetting: the `NotebookState` field that holds it, the tables
    that key it and its read scale. The record (record.py) replays each such memory from the same β."""

    field: str
    tables: NotebookTables
    read_scale: torch.Tensor


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


class Notebook(nn.Module):
    """Gate, forgetting and read scale of SPEC §3 around the fixed tables, with explicit state in and out."""

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
        forget_logit = torch.tensor(config.forget_logit_init)
        if config.forgetting and config.learn_forget_rate:
            self.forget_logit = nn.Parameter(forget_logit)
        else:  # held: a buffer, since from_pretrained makes every loaded parameter trainable again (and a trainable
            self.register_buffer("forget_logit", forget_logit)  # one without gradient stops DistributedDataParallel)
        self.trust = ReadTrust(config.initial_log_noise_cap, config.read_trust_bias_init) if config.read_trust else None
        if config.fact_bank:  # β_f = sigmoid(ℓ - d) of the write logit ℓ, and the fact bank's own read scale
            self.fact_shift = nn.Parameter(torch.tensor(float(config.fact_bank_shift_init)))
            self.fact_read_scale = nn.Parameter(torch.tensor(config.effective_read_scale_init))
        if config.repeat_key_window:
            self.repeat_read_scale = nn.Parameter(torch.tensor(config.effective_read_scale_init))
        self.repeat_trust = (ReadTrust(config.initial_log_noise_cap, config.read_trust_bias_init)
                             if config.repeat_read_trust else None)
        self._tables_key = None
        self._tables = None

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

    def tables(self) -> NotebookTables:
        """The fixed tables derived from the buffers, recomputed only when a buffer changes (load, .to())."""
        return self._derived_tables()[0]

    def repeat_tables(self) -> NotebookTables:
        """The repeat bank's tables: the first's with keys bound over the newest repeat_key_window slots only."""
        return self._derived_tables()[1]

    def _derived_tables(self) -> tuple[NotebookTables, NotebookTables | None]:
        buffers = dict(self._buffers)  # checked per call
        key = tuple(b.data_ptr() for b in buffers.values()) + tuple(b._version for b in buffers.values())
        if key != self._tables_key:  # .to() moves data_ptr, a load bumps _version
            tables, window = make_tables(buffers, self.config), self.config.repeat_key_window
            self._tables = (tables, tables.newest_slots(window) if window else None)
            self._tables_key = key
        return self._tables

    def banks(self) -> list[Bank]:
        """The first memory, then the repeat bank when there is one. A fact bank is not among them: its β differs."""
        banks = [Bank("spectrum", self.tables(), self.read_scale)]
        if self.config.repeat_key_window:
            banks.append(Bank("repeat_spectrum", self.repeat_tables(), self.repeat_read_scale))
        return banks

    def forget_rate(self) -> torch.Tensor:
        """g = forget_max · sigmoid(forget_logit), or 0 without forgetting."""
        if not self.config.forgetting:
            return self.forget_logit.new_zeros(())
        return self.config.forget_max * torch.sigmoid(self.forget_logit.float())

    def keep_factors(self, beta: torch.Tensor) -> torch.Tensor:
        """a = 1 - g β, clamped below at keep_clamp (1/Π a must stay finite within a scan chunk)."""
        return (1.0 - self.forget_rate() * beta).clamp_min(self.config.keep_clamp)

    def empty_state(self, batch_size: int, device: torch.device) -> NotebookState:
        spectrum = torch.zeros(batch_size, self.config.hrr_dim // 2 + 1, dtype=torch.complex64, device=device)
        tail = torch.full((batch_size, self.tail_length), PAD_ID, dtype=torch.long, device=device)
        last_logits = torch.zeros(batch_size, self.config.vocab_size if self.config.uses_surprise else 0, device=device)
        fact_spectrum = spectrum.clone() if self.config.fact_bank else spectrum[:, :0]
        repeat_spectrum = spectrum.clone() if self.config.repeat_key_window else spectrum[:, :0]
        return NotebookState(spectrum, tail, last_logits, fact_spectrum, repeat_spectrum)

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
        padding (valid None: no padding). With a fact bank [2B, T]: β, then the fact bank's β_f = sigmoid(ℓ - d)
        of the same logit ℓ (or the same write_mask)."""
        if write_mask is not None:
            beta = write_mask.float()
            fact_beta = beta
        else:
            logit = 0.0
            if self.gate is not None:
                logit = self.gate(ids_with_tail[:, -(self.config.gate_window - 1 + n_new):]).float()
            if self.config.uses_surprise:
                if surprise is None:
                    raise ValueError("this notebook writes by the trunk's surprise: pass trunk_logits")
                logit = logit + self.surprise_scale * (surprise - self.surprise_shift)
            beta = torch.sigmoid(logit)
            fact_beta = torch.sigmoid(logit - self.fact_shift) if self.config.fact_bank else None
        if self.config.fact_bank:
            beta = torch.cat([beta, fact_beta])
        return beta if valid is None else beta * valid.repeat(beta.shape[0] // valid.shape[0], 1)

    def write_inputs(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor | None,
        state: NotebookState | None,
        write_mask: torch.Tensor | None,
        trunk_logits: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, NotebookState]:
        """The ids with the state's tail before them [B, L+T], β [B, T] (gate and/or the trunk's surprise, or
        write_mask; [2B, T] with a fact bank: `write_strengths`), and the new state without its spectra."""
        state = state if state is not None else self.empty_state(input_ids.shape[0], input_ids.device)
        ids_with_tail = self.with_tail(input_ids, state)
        surprise, last_logits = None, state.last_logits  # without trunk_logits the last logits stay as they were
        if self.config.uses_surprise and (trunk_logits is not None or write_mask is None):
            if trunk_logits is None:
                raise ValueError("this notebook writes by the trunk's surprise: pass trunk_logits [B, T, V]")
            surprise, last_logits = trunk_surprise(input_ids, trunk_logits, state.last_logits, valid)
        beta = self.write_strengths(ids_with_tail, input_ids.shape[1], valid, write_mask, surprise)
        return ids_with_tail, beta, NotebookState(None, ids_with_tail[:, -self.tail_length:], last_logits,
                                                    state.fact_spectrum, state.repeat_spectrum)

    def combine(self, reads: list[torch.Tensor]) -> torch.Tensor:
        """The memories' reads [..., V] (`banks()` order) as `forward` returns them: summed, or side by side
        [..., 2V] where each memory has a read trust of its own (config.repeat_read_trust; `trusted` adds them)."""
        return torch.cat(reads, -1) if self.repeat_trust is not None else sum(reads[1:], reads[0])

    def trusted(self, reads: torch.Tensor, trunk_logits: torch.Tensor) -> torch.Tensor:
        """The memory's logits [..., V] from `forward`'s reads: with the read trust's extra nats (read_trust.py)
        where the config has one, each memory's through its own trust with config.repeat_read_trust; the trunk's
        logits broadcast to reads' shape."""
        if self.repeat_trust is not None:
            first, repeat = reads.split(self.config.vocab_size, -1)
            return self.trust(first, trunk_logits) + self.repeat_trust(repeat, trunk_logits)
        return reads if self.trust is None else self.trust(reads, trunk_logits)

    def forward(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor | None,
        state: NotebookState | None = None,
        write_mask: torch.Tensor | None = None,
        first_read: int = 0,
        trunk_logits: torch.Tensor | None = None,
        output_write_strengths: bool = False,
        operation: Callable = scan_and_read,
    ) -> tuple[torch.Tensor, NotebookState] | tuple[torch.Tensor, NotebookState, torch.Tensor]:
        """input_ids [B, T] (padding set to the pad id), valid [B, T] or None (no padding) -> (logit bias
        [B, T - first_read, V] of the positions from first_read on ([..., 2V]: `combine`), state), and β [B, T] when
        `output_write_strengths` (a write budget penalises it in training).

        `write_mask` [B, T] replaces β (oracle gate). trunk_logits [B, T, V] are needed when β uses the trunk's
        surprise. The read scale s, 0 at padding, weighs each position's read inside the operation. A fact bank
        runs in the same operation as B more sequences (`operation_inputs`); its read is added to the first's. A
        repeat bank runs the operation again with its own tables (`repeat_inputs`); its read is added too, or
        set beside the first's with config.repeat_read_trust (`combine`).
        `operation` is one of scan_read.py's forms: the tests run the whole notebook on the reference through it."""
        inputs, after = self.operation_inputs(input_ids, valid, state, write_mask, trunk_logits)
        reads, spectrum = operation(*inputs, first_read=first_read)
        B = input_ids.shape[0]
        if self.config.fact_bank:
            final = dataclasses.replace(after, spectrum=spectrum[:B], fact_spectrum=spectrum[B:])
            reads = reads[:B] + reads[B:]
        else:
            final = dataclasses.replace(after, spectrum=spectrum)
        if self.config.repeat_key_window:
            repeat_reads, repeat_spectrum = operation(*self.repeat_inputs(inputs, state, valid), first_read=first_read)
            reads = self.combine([reads, repeat_reads])
            final = dataclasses.replace(final, repeat_spectrum=repeat_spectrum)
        return (reads, final, inputs[2][:B]) if output_write_strengths else (reads, final)

    def repeat_inputs(self, inputs: tuple, state: NotebookState | None, valid: torch.Tensor | None) -> tuple:
        """The repeat bank's arguments of the operation from the first memory's `operation_inputs`: the same ids, β
        and keep factors, its own tables, spectrum and read scale."""
        _, ids_with_tail, beta, keep, _, _ = inputs
        B, T = beta.shape
        weights = self.repeat_read_scale.expand(B, T) if valid is None else self.repeat_read_scale * valid
        spectrum = None if state is None else state.repeat_spectrum
        return self.repeat_tables(), ids_with_tail, beta, keep, spectrum, weights

    def operation_inputs(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor | None,
        state: NotebookState | None = None,
        write_mask: torch.Tensor | None = None,
        trunk_logits: torch.Tensor | None = None,
    ) -> tuple[tuple, NotebookState]:
        """The arguments of scan_read.py's operation (any of its forms) for input_ids [B, T]: (tables, ids with the
        state's tail, β, keep factors or None, the state's spectrum or None, read weights s · valid), and the new
        state without its spectra. With a fact bank every argument has 2B rows: the first bank's, then the fact
        bank's (the same ids, β_f, keep factors of 1, its spectrum, its read scale)."""
        ids_with_tail, beta, after = self.write_inputs(input_ids, valid, state, write_mask, trunk_logits)
        B, T = input_ids.shape
        weights = self.read_scale.expand(B, T) if valid is None else self.read_scale * valid
        keep = self.keep_factors(beta[:B]) if self.config.forgetting else None
        spectrum = None if state is None else state.spectrum
        if self.config.fact_bank:
            ids_with_tail = ids_with_tail.repeat(2, 1)
            fact_weights = self.fact_read_scale.expand(B, T) if valid is None else self.fact_read_scale * valid
            weights = torch.cat([weights, fact_weights])
            keep = None if keep is None else torch.cat([keep, torch.ones_like(keep)])
            spectrum = None if state is None else torch.cat([state.spectrum, state.fact_spectrum])
        return (self.tables(), ids_with_tail, beta, keep, spectrum, weights), after
