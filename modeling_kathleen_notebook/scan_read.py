"""The notebook's one operation (SPEC §3, equations (1)-(5)): write each byte into the memory, read the memory at
each position. Three forms with one signature, chosen by `scan_and_read`:

    scan_and_read_reference   (1)-(5) one byte at a time in the time domain, float64: the oracle of the others
    scan_and_read_chunked     keys by table (codebooks.py), then the scan in closed form a chunk at a time
                              (scan_read_chunk.py: PyTorch blocks or kernels.py's compiled loops)
    scan_and_read_step        one byte: kernels.py's `notebook_step` where it applies, else a few PyTorch ops

Each takes (tables, ids_with_tail [B, L + T]: the state's last L ids then the T new ones, β [B, T], keep factors
[B, T] or None (no forgetting), the memory spectrum [B, F] or None (empty), read weights ρ [B, T] or None (all 1),
first_read) and returns (reads [B, T - first_read, V] of the positions from first_read on, the memory [B, F]):

    M_t = a_t · M_{t-1} + β_t · w_t        w_t = K_{t-1} ⊙ CV[x_t], a_t the keep factor
    r_t = ρ_t · read_out(M_t ⊙ conj(K_t))  K_t the unit key of the window ending at t

The memory is the unnormalised rfft of the memory vector, whatever the FFT convention of the bindings.
"""

from __future__ import annotations

import torch

from .codebooks import NotebookTables, bound_key_spectra
from .configuration_kathleen import PAD_ID
from .scan_read_chunk import ScanReadChunk, compiled_kernels

PIECE_ELEMENTS = 1 << 22  # positions x frequencies of keys formed at once: 32 MiB of complex64 per sequence


def scan_and_read(
    tables: NotebookTables,
    ids_with_tail: torch.Tensor,
    beta: torch.Tensor,
    keep: torch.Tensor | None,
    memory: torch.Tensor | None = None,
    read_weights: torch.Tensor | None = None,
    first_read: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The operation, by its step form for one byte and its chunked form otherwise."""
    form = scan_and_read_step if beta.shape[1] == 1 else scan_and_read_chunked
    return form(tables, ids_with_tail, beta, keep, memory, read_weights, first_read)


def scan_and_read_reference(
    tables: NotebookTables,
    ids_with_tail: torch.Tensor,
    beta: torch.Tensor,
    keep: torch.Tensor | None,
    memory: torch.Tensor | None = None,
    read_weights: torch.Tensor | None = None,
    first_read: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Equations (1)-(5) literally: each key a sum of circular convolutions of the codebook rows (bundled keys) or
    the inverse FFT of its phases (bound keys), normalised; the memory a vector; the read a circular correlation
    and a product with the value codebook. Pad ids stand for "nothing there": their key terms are left out, and a
    window of padding only has the zero key. Reads and memory in float64 (complex128)."""
    settings = tables.settings
    B, T = beta.shape
    R, W, L = settings.hrr_dim, settings.key_window, ids_with_tail.shape[1] - T
    norm = settings.fft_norm
    values = tables.values_in_time().double()

    def cconv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.fft.irfft(torch.fft.rfft(a, norm=norm) * torch.fft.rfft(b, norm=norm), n=R, norm=norm)

    def ccorr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.fft.irfft(torch.fft.rfft(a, norm=norm) * torch.fft.rfft(b, norm=norm).conj(), n=R, norm=norm)

    def key_at(i: int) -> torch.Tensor:  # (1) for the window ending at column i of ids_with_tail
        window = ids_with_tail[:, i - W + 1:i + 1]  # [B, W], oldest first
        if tables.bound:
            key = torch.fft.irfft(bound_key_spectra(window, tables.key_frequencies).to(torch.complex128), n=R)
        else:
            key = values.new_zeros(B, R)
            for j in range(W):
                byte = window[:, W - 1 - j]
                present = (byte != PAD_ID).double().unsqueeze(1)
                key = key + present * cconv(tables.roles[j].double().expand(B, R), tables.key_codebook[byte].double())
        key = key * (window != PAD_ID).any(dim=1, keepdim=True)
        length = key.norm(dim=1, keepdim=True)
        return torch.where(length > 0, key / length.clamp_min(1e-300), 0.0)

    vector = values.new_zeros(B, R) if memory is None else torch.fft.irfft(memory.to(torch.complex128), n=R)
    previous, reads = key_at(L - 1), []
    for t in range(T):
        key = key_at(L + t)
        decay = 1.0 if keep is None else keep[:, t].double().unsqueeze(1)
        vector = decay * vector + beta[:, t].double().unsqueeze(1) * cconv(previous, values[ids_with_tail[:, L + t]])
        read = ccorr(vector, key) @ values.T  # (4), (5)
        reads.append(read if read_weights is None else read * read_weights[:, t].double().unsqueeze(1))
        previous = key
    return torch.stack(reads[first_read:], dim=1), torch.fft.rfft(vector)


def scan_and_read_chunked(
    tables: NotebookTables,
    ids_with_tail: torch.Tensor,
    beta: torch.Tensor,
    keep: torch.Tensor | None,
    memory: torch.Tensor | None = None,
    read_weights: torch.Tensor | None = None,
    first_read: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys a piece at a time (the [B, T, F] keys of a long input at a large R would not fit in memory), and within
    a piece chunks of `scan_chunk` positions (one chunk without forgetting), each a `ScanReadChunk`:
    M_t = P_t · (M_start + Σ_{u ≤ t} (β_u / P_u) w_u) with P_t = Π_{u ≤ t} a_u. scan_chunk · log(1 / min keep) < 80
    keeps 1/P finite in fp32. ρ joins the chunk's per-position read factor (no pass over [B, T, V]).

    A chunk that ends before first_read only advances the memory, M_end = P_end · (M_start + Σ_u (β_u / P_u) w_u):
    one weighted sum instead of a cumulative sum and a read at every position (prefill keeps the last logits)."""
    B, T = beta.shape
    L = ids_with_tail.shape[1] - T
    piece = max(tables.settings.scan_chunk, PIECE_ELEMENTS // tables.write_values.shape[1])
    step = T if keep is None else tables.settings.scan_chunk
    cuts = sorted({*range(0, T, step), *range(0, T, piece), first_read} - {T})  # chunks start where reading does
    reads, bindings, formed = [], None, 0
    for start, stop in zip(cuts, cuts[1:] + [T]):
        if bindings is None or stop > formed:  # the next piece of keys
            formed = min(start + piece, T)
            bindings = tables.bind(ids_with_tail[:, :L + formed], formed - start)
            offset = start
        part, here = slice(start, stop), bindings.part(slice(start - offset, stop - offset))
        if keep is None:
            prod, coeff = None, beta[:, part]
        else:
            prod = torch.cumprod(keep[:, part], dim=1)  # P_t [B, C]
            coeff = beta[:, part] / prod
        if stop <= first_read:  # nothing to read here: the memory at the chunk's end is all that is needed
            summed = torch.bmm(coeff.unsqueeze(1).to(here.keys.dtype), here.writes()).squeeze(1)
            summed = summed if memory is None else summed + memory
        else:
            weights = None if read_weights is None else read_weights[:, part]
            read, summed = ScanReadChunk.apply(coeff, prod, here, memory, tables.reader, weights)
            reads.append(read[:, max(first_read - start, 0):])
        memory = summed if prod is None else summed * prod[:, -1:]
    return torch.cat(reads, dim=1), memory


def scan_and_read_step(
    tables: NotebookTables,
    ids_with_tail: torch.Tensor,
    beta: torch.Tensor,
    keep: torch.Tensor | None,
    memory: torch.Tensor | None = None,
    read_weights: torch.Tensor | None = None,
    first_read: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One byte per sequence (T = 1): M = a · M + β w, then the read. Without autograd, with bundled keys and the
    Fourier read on a CPU, one call of kernels.py's `notebook_step` (keys, their scales, write, the read's bins)
    instead of some thirty small PyTorch ops; `scan_and_read_chunked` is its oracle in the tests."""
    B = beta.shape[0]
    memory = memory if memory is not None else tables.write_values.new_zeros(B, tables.write_values.shape[1])
    weights = torch.ones_like(beta) if read_weights is None else read_weights
    reader, W = tables.reader, tables.settings.key_window
    kernels = None if torch.is_grad_enabled() or tables.bound else compiled_kernels(reader, memory, tables.write_values)
    if kernels is not None:
        bins, memory, scales = kernels.notebook_step(
            tables.key_rows, tables.row_offsets, ids_with_tail[:, -(W + 1):], tables.write_values, memory,
            beta.view(-1), beta[:0] if keep is None else keep.view(-1), reader.frequencies, reader.period)
        reads = reader.read_bins(bins) * (scales * weights.view(-1)).unsqueeze(-1)  # [B, V]
        return reads.unsqueeze(1)[:, first_read:], memory
    bindings = tables.bind(ids_with_tail, 1)
    scales = bindings.key_scales  # [B, 2]: σ_{t-1}, σ_t
    written = bindings.unscaled_writes()[:, 0]
    memory = torch.addcmul(memory if keep is None else keep * memory, beta * scales[:, :1], written)
    read = reader((memory * bindings.keys[:, 1].conj()).unsqueeze(1)) * (scales[:, 1:] * weights).unsqueeze(-1)
    return read[:, first_read:], memory
