"""The comparison arm (SPEC §4): one causal softmax attention head on the trunk output.

It reads the trunk's normalised hidden state and adds a logit bias, like the notebook, and is sized
to the notebook's trainable parameter count (`KathleenConfig.effective_attention_dim`). Unlike the
notebook its state grows with length: it keeps every key and value it has seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .configuration_kathleen import KathleenConfig


@dataclass
class AttentionState:
    """Keys and values of every position read so far (the arm's cost is quadratic, by design)."""

    keys: torch.Tensor  # [B, S, A]
    values: torch.Tensor  # [B, S, A]
    valid: torch.Tensor  # [B, S] bool, False at padding


class AttentionHead(nn.Module):
    """q, k, v: D -> A; causal softmax over valid past positions; out: A -> V logits."""

    def __init__(self, config: KathleenConfig):
        super().__init__()
        a = config.effective_attention_dim
        self.query_proj = nn.Linear(config.d_model, a, bias=False)
        self.key_proj = nn.Linear(config.d_model, a, bias=False)
        self.value_proj = nn.Linear(config.d_model, a, bias=False)
        self.out_proj = nn.Linear(a, config.vocab_size, bias=False)

    def forward(
        self, hidden: torch.Tensor, valid: torch.Tensor | None, state: AttentionState | None = None
    ) -> tuple[torch.Tensor, AttentionState]:
        """hidden [B, T, D], valid [B, T] or None (all) -> (logit bias [B, T, V], state holding all S + T
        positions)."""
        if valid is None:
            valid = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
        q, k, v = self.query_proj(hidden), self.key_proj(hidden), self.value_proj(hidden)
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
        return logits, AttentionState(k.float(), v.float(), valid_keys)
