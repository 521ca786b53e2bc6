"""What each position wrote into a notebook, recomputed from the bytes alone, and the exact arithmetic the memory
operations do with it (SPEC §3, "Memory operations"; `NotebookSession` in session.py).

The notebook is linear in its writes, so a record of token ids and write strengths β is enough to recompute
what any span S contributed to the memory, with every forgetting factor applied after it:

    C_S = Σ_{u in S} D_u β_u w_u,   D_u = Π_{v > u} a_v (the survival of a write),   w_u = K_{u-1} ⊙ CV[x_u]

`trace` forms keys, writes, β and keep factors; `scan` replays the recurrence on them, `contribution` replays one
span's writes alone; `survival` and `span_contributions` give the contributions at the end of a record directly, and
`grouped_writes` those of scattered positions that share a few keys (`preceding_windows`: each position's key).
A repeat bank is written with the same β and forgetting and differs only in its keys, so each takes the tables of
one memory (`Notebook.memories`); a fact bank, written with another β, has no record yet.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .codebooks import NotebookTables
from .configuration_kathleen import PAD_ID
from .notebook import Notebook, NotebookState
from .scan import cumulative_sum_scan, linear_scan
from .scan_read import PIECE_ELEMENTS


@dataclass
class NotebookTrace:
    """Everything the memory does at each position."""

    keys: torch.Tensor  # [B, T, F] complex, K_t (unit keys; zero for a window of padding)
    writes: torch.Tensor  # [B, T, F] complex, w_t = K_{t-1} ⊙ CV[x_t] (times the binding scale)
    beta: torch.Tensor  # [B, T] write strength (0 at padding)
    keep: torch.Tensor  # [B, T] forgetting factor a_t = 1 - g β_t (1 without forgetting)


def trace(
    notebook: Notebook,
    input_ids: torch.Tensor,
    valid: torch.Tensor | None,
    state: NotebookState | None = None,
    write_mask: torch.Tensor | None = None,
    trunk_logits: torch.Tensor | None = None,
    tables: NotebookTables | None = None,
) -> tuple[NotebookTrace, NotebookState]:
    """Keys, writes, β and keep factors for input_ids [B, T] (padding already set to the pad id), and the new state
    without its spectra (None: `scan` advances them). `tables` picks the memory (default: the first; a repeat
    bank's are `notebook.repeat_tables()`). A notebook with a fact bank has no record yet."""
    if notebook.config.fact_bank:
        raise ValueError("attribution and unlearning do not cover a notebook with a fact bank (config.fact_bank): "
                         "it is written with another β than the record keeps")
    ids_with_tail, beta, after = notebook.write_inputs(input_ids, valid, state, write_mask, trunk_logits)
    with torch.no_grad():  # keys and writes depend on the fixed tables only
        bindings = (tables or notebook.tables()).bind(ids_with_tail, input_ids.shape[1])
        keys, writes = bindings.normalised_keys(), bindings.writes()
    return NotebookTrace(keys, writes, beta, notebook.keep_factors(beta)), after


def scan(
    notebook: Notebook,
    trace: NotebookTrace,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(3) for every position: memory spectra [B, T, F] and the last one [B, F]."""
    inputs = trace.beta.unsqueeze(-1) * trace.writes
    if not notebook.config.forgetting:
        return cumulative_sum_scan(inputs, initial_state, output_final_state)
    return linear_scan(trace.keep.unsqueeze(-1), inputs, initial_state, output_final_state, notebook.config.scan_chunk)


def contribution(
    notebook: Notebook, trace: NotebookTrace, span_mask: torch.Tensor, output_final_state: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What the writes at span_mask [B, T] add to the memory at every position, with every later forgetting factor
    applied: C_t = Σ_{u ≤ t, u in span} (Π_{u < v ≤ t} a_v) β_u w_u. Subtracting it from the memory unlearns the
    span."""
    return scan(notebook, dataclasses.replace(trace, beta=trace.beta * span_mask), None, output_final_state)


def survival(keep: torch.Tensor) -> torch.Tensor:
    """D_u = Π_{v > u} a_v [T] (float64) for the keep factors a [T] of a record: how much of the write at u is left
    at its end."""
    log_keep = torch.log(keep.double())
    return (log_keep.flip(0).cumsum(0).flip(0) - log_keep).exp()


@torch.no_grad()
def span_contributions(
    notebook: Notebook,
    ids: torch.Tensor,
    weight: torch.Tensor,
    spans: list[tuple[int, int]],
    chunk_size: int | None = None,
    tables: NotebookTables | None = None,
) -> torch.Tensor:
    """Σ_{u in span} weight_u w_u [len(spans), F] complex for each span [start, end) of a record of token ids [T]
    read from an empty tail, with weight [T] (D_u β_u for what a span adds to the memory now) and the writes of the
    memory `tables` picks (default: the first). The record is traced `chunk_size` positions at a time (default: as
    many as keep [chunk, F] spectra near 32 MiB), and chunks no span touches are skipped."""
    length, bins = len(ids), notebook.config.hrr_dim // 2 + 1
    chunk_size = chunk_size or max(64, PIECE_ELEMENTS // bins)
    owner = torch.full((length,), -1, dtype=torch.long)
    for i, (a, b) in enumerate(spans):
        if not 0 <= a < b <= length:
            raise ValueError(f"span ({a}, {b}) is not inside the {length} positions read")
        owner[a:b] = i
    out = torch.zeros(len(spans), bins, dtype=torch.complex64)
    L = notebook.tail_length
    for start in range(0, length, chunk_size):
        part = slice(start, min(start + chunk_size, length))
        mine = owner[part] >= 0
        if not mine.any():
            continue
        tail = torch.cat([torch.full((L,), PAD_ID), ids[:start]])[-L:]
        empty = torch.zeros(1, bins, dtype=torch.complex64)  # writes only: the weights come from the record
        state = NotebookState(empty, tail.unsqueeze(0), torch.zeros(1, 0), empty[:, :0], empty[:, :0])
        chunk = ids[part].unsqueeze(0)
        traced, _ = trace(notebook, chunk, None, state, write_mask=torch.ones_like(chunk, dtype=torch.float),
                          tables=tables)
        out.index_add_(0, owner[part][mine], weight[part][mine].unsqueeze(-1) * traced.writes[0][mine])
    return out


def preceding_windows(ids: torch.Tensor, width: int) -> torch.Tensor:
    """[T, width]: the `width` ids before each position of a record read from an empty tail (padding before its
    start), the window a write at that position is keyed by."""
    return torch.cat([torch.full((width,), PAD_ID, dtype=ids.dtype), ids]).unfold(0, width, 1)[:-1]


@torch.no_grad()
def grouped_writes(tables: NotebookTables, ids: torch.Tensor, weight: torch.Tensor,
                   positions: torch.Tensor) -> torch.Tensor:
    """Σ_{u in positions} weight_u w_u [F] complex for a record of token ids [T] read from an empty tail, with the
    writes of the memory `tables` picks. A write depends only on its key's window and its value, so the weights are
    summed per distinct (window, value) pair first: positions scattered over a long record that share a few keys
    cost a few writes, where `span_contributions` would trace every chunk they lie in."""
    pairs = torch.cat([preceding_windows(ids, tables.settings.key_window)[positions], ids[positions, None]], 1)
    if len(pairs) == 0:
        return torch.zeros(tables.settings.hrr_dim // 2 + 1, dtype=torch.complex64)
    unique, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    summed = torch.zeros(len(unique), dtype=torch.float64).index_add_(0, inverse, weight[positions].double())
    writes = tables.bind(unique, 1).writes()[:, 0]  # [pairs, F]
    return (summed.float().unsqueeze(-1) * writes).sum(0)
