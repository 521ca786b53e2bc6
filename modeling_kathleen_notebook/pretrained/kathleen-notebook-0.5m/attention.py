"""The comparison arm (SPEC §4): one causal softmax attention head on the trunk output.

It reads the trunk's normalised hidden state and adds a logit bias, like the notebook, and is sized
to the notebook's trainable parameter count (`KathleenConfig.effective_attention_dim`). Unlike the
notebook its state grows with length: it keeps every key and value it has seen. With attention_keys
"previous", position t's key is made from the hidden state at t - 1 (the last real position before it), so
a query of a context finds the position right after that context elsewhere, and its value: the notebook's
key_{t-1} ⊛ value_t, learned instead of fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .configuration_kathleen import KathleenConfig
from .scan import last_real_rows


@dataclass
class AttentionState:
    """Keys and values of every position read so far (the arm's cost is quadratic, by design)."""

    keys: torch.Tensor  # [B, S, A]
    values: torch.Tensor  # [B, S, A]
    valid: torch.Tensor  # [B, S] bool, False at padding
    # [B, A]: with attention_keys "previous", the key the next position gets (from the last real hidden state);
    # [B, 0] otherwise
    pending_key: torch.Tensor


class AttentionHead(nn.Module):
    """q, k, v: D -> A; causal softmax over valid past positions; out: A -> V logits."""

    def __init__(self, config: KathleenConfig):
        super().__init__()
        a = config.effective_attention_dim
        self.query_proj = nn.Linear(config.d_model, a, bias=False)
        self.key_proj = nn.Linear(config.d_model, a, bias=False)
        self.value_proj = nn.Linear(config.d_model, a, bias=False)
        self.out_proj = nn.Linear(a, config.vocab_size, bias=False)
        self.previous_keys = config.attention_keys == "previous"

    def forward(
        self, hidden: torch.Tensor, valid: torch.Tensor | None, state: AttentionState | None = None
    ) -> tuple[torch.Tensor, AttentionState]:
        """hidden [B, T, D], valid [B, T] or None (all) -> (logit bias [B, T, V], state holding all S + T
        positions)."""
        if valid is None:
            valid = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
        q, k, v = self.query_proj(hidden), self.key_proj(hidden), self.value_proj(hidden)
        k, pending = self.shifted(k, valid, state) if self.previous_keys else (k, k.new_zeros(k.shape[0], 0))
        if state is not None:
            k = torch.cat([state.keys.to(k.dtype), k], dim=1)
            v = torch.cat([state.values.to(v.dtype), v], dim=1)
            valid_keys = torch.cat([state.valid, valid], dim=1)
        else:
            valid_keys = valid
        T, S = q.shape[1], k.shape[1]
        # query t sits at absolute position S - T + t and sees keys up to there
        causal = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
        allowed = causal & valid_keys.unsqueeze(1)  # [B, T, S]
        scores = (q @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        # a finite floor, not -inf: a padded query may see no key at all, and must not produce NaN
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        logits = self.out_proj(weights @ v) * valid.unsqueeze(-1)
        return logits, AttentionState(k.float(), v.float(), valid_keys, pending.float())

    def shifted(
        self, keys: torch.Tensor, valid: torch.Tensor, state: AttentionState | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys [B, T, A] made at each position, moved one real position later: position t gets the key of the last
        real position before it (the state's pending key before the first; zeros at the very start). Returns them
        and the key the next call's first position gets."""
        B, T, A = keys.shape
        before = keys.new_zeros(B, 1, A) if state is None else state.pending_key.to(keys.dtype).unsqueeze(1)
        made = torch.cat([before, keys], dim=1)  # row 0: before this call, row t+1: made at position t
        latest = last_real_rows(valid, B, T, keys.device)
        source = torch.cat([latest.new_zeros(B, 1), latest[:, :-1]], dim=1)  # the last real row before t
        shifted = made.gather(1, source.unsqueeze(-1).expand(B, T, A))
        return shifted, made[torch.arange(B, device=keys.device), latest[:, -1]]
