"""Exact bits/byte of text of any length, streamed through the cache in constant memory (SPEC §6.2).

Two protocols, both exact (nothing is sampled):

- stream (window=None): the whole text is one sequence. The separator (eos) stands before the first
  byte, so every byte is scored; the text is fed in chunks of `chunk_size`, carrying the cache.
- windows of L bytes: the state is empty at each window start, and each window is scored with only
  the byte before it as context (eos before the first window); the bytes after the last full window are
  scored in the L-byte window that ends with the text, the bytes before them read as context only. This is
  lm-evaluation-harness's `loglikelihood_rolling` with max_length = L (its last window is right-aligned
  the same way), so the two agree.

On text shorter than a chunk, the stream protocol is one full forward of [eos] + text.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .configuration_kathleen import EOS_ID

# bytes fed per model call. Each call's transients (keys [chunk, R/2+1] complex, logits [chunk, V]) are what the
# peak memory grows by: at 1,024, 1,000,000 streamed bytes peak at 1.06x the memory of 1,000 (4,096: 1.22x), and
# no slower (`python scripts/bench.py --streaming-only N`)
STREAM_CHUNK = 1024


@torch.no_grad()
def stream_log_probs(
    model, inputs: torch.Tensor, targets: torch.Tensor, chunk_size: int = STREAM_CHUNK, on_chunk=None,
    readout: str | tuple[str, ...] = "logits",
) -> torch.Tensor:
    """log p(targets[:, t] | inputs[:, :t+1]) for every t, in nats: [B, T], fed chunk by chunk.

    inputs, targets [B, T]: targets are inputs shifted by one (the caller decides what comes first).
    on_chunk(n) is called with the number of bytes scored after each chunk (progress bars).
    readout: which logits of the output are scored: "logits" (the model's) or "trunk_logits" (a notebook
    model's trunk alone, before the memory's read is added: what separates the trunk's share of a cost from the
    read's); or a tuple of such names, scored from the same forward: then [len(readout), B, T].
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size is the bytes fed per forward call: at least 1, got {chunk_size}")
    if inputs.shape != targets.shape or inputs.numel() == 0:
        raise ValueError(f"inputs and targets must be equal, non-empty [B, T]; got {tuple(inputs.shape)} "
                         f"and {tuple(targets.shape)}")
    names = (readout,) if isinstance(readout, str) else tuple(readout)
    # one output buffer up front: small per-chunk results kept between the big transient chunk tensors
    # fragment glibc's heap, which then grows by megabytes per chunk (measured: 950 MiB at 1M bytes)
    cache, out = None, torch.empty((len(names), *inputs.shape), dtype=torch.float32)
    for start in range(0, inputs.shape[1], chunk_size):
        part = slice(start, start + chunk_size)
        result = model(inputs[:, part].to(model.device), cache=cache, use_cache=True)
        cache = result.cache
        wanted = targets[:, part].to(model.device).unsqueeze(-1)
        for row, name in zip(out, names):
            row[:, part] = F.log_softmax(getattr(result, name).float(), dim=-1).gather(-1, wanted).squeeze(-1).cpu()
        if on_chunk is not None:
            on_chunk(inputs[:, part].numel())
    return out[0] if isinstance(readout, str) else out


def byte_bits(
    model, ids: torch.Tensor, window: int | None = None, chunk_size: int = STREAM_CHUNK, batch_size: int = 16,
    progress: str | None = None, readout: str | tuple[str, ...] = "logits",
) -> torch.Tensor:
    """Bits spent on each byte of a text (ids [N], no separator): [N] float32, or [len(readout), N] for a tuple of
    readouts (all from one pass). progress: a bar with this name; readout: as in `stream_log_probs`."""
    from tqdm.auto import tqdm

    ids = ids.flatten().long()
    if ids.numel() == 0:
        raise ValueError("cannot score an empty text")
    if window is not None and window < 1:
        raise ValueError(f"window is the bytes of each independent window: at least 1 (None: one stream), got {window}")
    previous = torch.cat([torch.tensor([EOS_ID]), ids[:-1]])  # the input that predicts each byte
    with tqdm(total=len(ids), desc=progress, unit="B", unit_scale=True, disable=progress is None) as bar:
        if window is None:
            nats = stream_log_probs(model, previous.unsqueeze(0), ids.unsqueeze(0), chunk_size, bar.update,
                                    readout)[..., 0, :]
            return -nats / math.log(2)
        bits, full = [], (len(ids) // window) * window
        rows_in, rows_out = previous[:full].view(-1, window), ids[:full].view(-1, window)
        for i in range(0, len(rows_in), batch_size):  # independent windows, several at once
            nats = stream_log_probs(model, rows_in[i:i + batch_size], rows_out[i:i + batch_size], chunk_size,
                                    bar.update, readout)
            bits.append(-nats.flatten(-2) / math.log(2))
        if full < len(ids):  # the bytes after the last full window: scored in the window that ends with the text
            start = max(0, len(ids) - window)  # (its earlier bytes are context only, as in lm-eval's last window)
            nats = stream_log_probs(model, previous[start:].unsqueeze(0), ids[start:].unsqueeze(0), chunk_size,
                                    readout=readout)
            bar.update(len(ids) - full)
            bits.append(-nats[..., 0, full - start:] / math.log(2))
        return torch.cat(bits, dim=-1)


def bits_per_byte(
    model, ids: torch.Tensor, window: int | None = None, chunk_size: int = STREAM_CHUNK, progress: str | None = None
) -> float:
    """Mean bits per byte of a text under `byte_bits` (progress: a bar with this name)."""
    return byte_bits(model, ids, window, chunk_size, progress=progress).mean().item()
