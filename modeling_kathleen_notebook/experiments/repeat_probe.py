"""The repeat probe of SPEC §6.2: does the memory make repeated words cheaper, and first mentions not dearer?

Text is cut into non-overlapping windows of L bytes, each scored from an empty state (`scoring`).
Words are runs of at least 4 ASCII letters. In each window a word is a *first mention* if its form
has not occurred earlier in the window, and a *repeat* if its most recent earlier occurrence starts
at least 64 bytes before it (nearer repeats are left out of both sets). Every byte of a word takes
its class; repeats also carry their distance, binned 64-256, 256-1024 and >= 1024 bytes.
"""

from __future__ import annotations

import re

import torch

from ..scoring import byte_bits
from ..tokenization_kathleen import bytes_to_ids

WORD = re.compile(rb"[A-Za-z]{4,}")
OTHER, FIRST, REPEAT, NEAR = 0, 1, 2, 3
DISTANCE_BINS = ((64, 256), (256, 1024), (1024, None))


def classify_bytes(data: bytes, window: int, min_distance: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(kind [N] of OTHER / FIRST / REPEAT / NEAR, distance [N] to the previous occurrence, 0 if none)."""
    kind = torch.full((len(data),), OTHER, dtype=torch.int8)
    distance = torch.zeros(len(data), dtype=torch.long)
    for start in range(0, len(data), window):
        last_seen: dict[bytes, int] = {}
        for match in WORD.finditer(data, start, min(start + window, len(data))):
            a, b, form = match.start(), match.end(), match.group()
            if form not in last_seen:
                kind[a:b] = FIRST
            else:
                gap = a - last_seen[form]
                kind[a:b] = REPEAT if gap >= min_distance else NEAR
                distance[a:b] = gap
            last_seen[form] = a
    return kind, distance


def exact_context_reach(data: bytes, window: int, key_window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What an exact-match key of `key_window` bytes could recall, window by window from an empty memory, with no
    model: (stored [N] bool, rivals [N] bool). stored: the key_window bytes before this one (fewer at a window's
    start) occurred earlier in the window followed by this same byte, so a key that matches only its exact context
    (key_binding "bind") has this byte in memory if it was written. rivals: the context occurred earlier followed by
    some other byte, which a read of this key returns too (alone, where the byte is not stored: a wrong answer)."""
    stored = torch.zeros(len(data), dtype=torch.bool)
    rivals = torch.zeros(len(data), dtype=torch.bool)
    for start in range(0, len(data), window):
        followers: dict[bytes, set[int]] = {}
        for i in range(start + 1, min(start + window, len(data))):
            seen = followers.setdefault(data[max(start, i - key_window):i], set())
            stored[i], rivals[i] = data[i] in seen, bool(seen - {data[i]})
            seen.add(data[i])
    return stored, rivals


@torch.no_grad()
def gate_betas(model, ids: torch.Tensor, window: int) -> torch.Tensor:
    """The notebook's write strength β at every byte, read window by window from an empty state: [N]."""
    out = []
    for start in range(0, len(ids), window):
        row = ids[start:start + window].unsqueeze(0)
        out.append(model(row, use_cache=False, logits_to_keep=1, output_write_strengths=True).write_strengths[0])
    return torch.cat(out)


def probe(model, data: bytes, window: int, with_gate: bool, batch_size: int = 16, progress: str | None = None,
          betas: bool = True) -> dict:
    """bits/byte overall, on first mentions and on repeats (all and per distance bin); for a notebook model
    (with_gate) also its trunk's own bits on first mentions (`bpb_first_trunk_readout`), which split a
    first-mention cost into the trunk's share and the read's, and (unless betas is False: a second pass over the
    text, slow at a large R) the mean β on repeats and elsewhere. batch_size: windows scored at once (memory grows
    with it; the results do not depend on it). progress: a bar with this name over the scoring pass."""
    ids = bytes_to_ids(data)
    readouts = ("logits", "trunk_logits") if with_gate else ("logits",)
    bits, *trunk_bits = byte_bits(model, ids, window=window, batch_size=batch_size, readout=readouts,
                                  progress=progress)
    kind, distance = classify_bytes(data, window)
    first, repeat = kind == FIRST, kind == REPEAT
    result = {"bpb": bits.mean().item(), "bpb_first": bits[first].mean().item(),
              "bpb_repeat": bits[repeat].mean().item(), "first_bytes": int(first.sum()),
              "repeat_bytes": int(repeat.sum())}
    for lo, hi in DISTANCE_BINS:
        in_bin = repeat & (distance >= lo) & (distance < (hi or len(data) + 1))
        result[f"bpb_repeat_{lo}-{hi or 'inf'}"] = bits[in_bin].mean().item() if in_bin.any() else float("nan")
        result[f"repeat_bytes_{lo}-{hi or 'inf'}"] = int(in_bin.sum())
    if with_gate:
        result["bpb_first_trunk_readout"] = trunk_bits[0][first].mean().item()
    if with_gate and betas:
        beta = gate_betas(model, ids, window)
        result["beta_repeat"] = beta[repeat].mean().item()
        result["beta_other"] = beta[~repeat].mean().item()
    return result


def repeat_gains(scores: dict) -> dict[str, float]:
    """A model's own repeat gain (bpb on first mentions - bpb on repeats) over all repeats and per distance bin."""
    return {key.removeprefix("bpb_repeat").lstrip("_") or "all": scores["bpb_first"] - scores[key]
            for key in scores if key.startswith("bpb_repeat")}


def probe_against_trunk(model, trunk, test: bytes, lengths: list[int], batch_size: int = 16) -> dict:
    """Extra repeat gain per distance bin and first-mention cost of `model` against a bare `trunk` (SPEC §6.2), with
    the two models' own repeat gains it is the difference of."""
    out = {}
    for length in lengths:
        mine = probe(model, test, length, with_gate=True, batch_size=batch_size, progress=f"repeat probe, {length}",
                     betas=False)  # β is not reported here, and its pass is a third of the probe's time
        base = probe(trunk, test, length, with_gate=False, batch_size=batch_size,
                     progress=f"repeat probe, {length}, trunk")
        own, trunk_own = repeat_gains(mine), repeat_gains(base)
        gain = {key: own[key] - trunk_own[key] for key in own}
        out[str(length)] = {"extra_repeat_gain": gain, "repeat_gain": own, "trunk_repeat_gain": trunk_own,
                            "first_mention_cost": mine["bpb_first"] - base["bpb_first"],
                            # its two shares: the model's own trunk against the bare trunk, then what the read adds
                            "first_mention_cost_trunk": mine["bpb_first_trunk_readout"] - base["bpb_first"],
                            "first_mention_cost_read": mine["bpb_first"] - mine["bpb_first_trunk_readout"],
                            "bpb": mine["bpb"], "trunk_bpb": base["bpb"]}
    return out
