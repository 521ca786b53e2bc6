"""The Kathleen trunk (SPEC §2): leaky integrators at three time scales plus a short causal convolution.

Per block, with u = LayerNorm(h):

    γ_t = lo + (hi - lo) · sigmoid(W_a u_t)          per-channel band [lo, hi]
    s_t = γ_t · s_{t-1} + (1 - γ_t) · W_v u_t         leaky integrator, fp32
    c_t = Σ_{j<K} w_j ⊙ u_{t-j} + b                   causal depthwise conv, kernel K = 7
    m_t = sigmoid(W_m u_t)
    h  += Dropout(W_o (m ⊙ s + (1 - m) ⊙ c))
    h  += Dropout(FFN(LayerNorm(h)))

Positions where `valid` is False (padding) leave the state untouched: γ = 1 and a zero conv input;
valid=None means every position is a byte (no masking ops: they show in per-byte decoding).
The state between calls is a `TrunkState` per block; its size does not depend on length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from .activation import gelu
from .configuration_kathleen import KathleenConfig
from .scan import linear_scan

# 0.5 ** 64 ≈ 5e-20 keeps the chunked scan's running product a normal fp32 number (γ ≥ 0.5).
TRUNK_SCAN_CHUNK = 64


@dataclass
class TrunkState:
    """State of one trunk block after the bytes read so far."""

    integrator: torch.Tensor  # [B, D] fp32, s_{t}
    conv_tail: torch.Tensor  # [B, K-1, D] fp32, the last K-1 conv inputs u (zeros before the start)


def band_limits(d_model: int, bands: list[list[float]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) of γ per channel [D]: thirds by channel index, the remainder to the slowest band."""
    third = d_model // 3
    sizes = [third, third, d_model - 2 * third]
    lo = torch.cat([torch.full((n,), band[0]) for n, band in zip(sizes, bands)])
    hi = torch.cat([torch.full((n,), band[1]) for n, band in zip(sizes, bands)])
    return lo.to(device), hi.to(device)


def causal_depthwise_conv(
    inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, tail: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """c_t = b + Σ_j weight[j] ⊙ u_{t-j} as K shifted multiplies (a grouped Conv1d backward is slow on CPU).

    inputs [B, T, D], weight [K, D], bias [D], tail [B, K-1, D] (the inputs before t = 0, zeros if None).
    Returns c [B, T, D] and the new tail [B, K-1, D].
    """
    K = weight.shape[0]
    B, T, D = inputs.shape
    if tail is None:
        tail = inputs.new_zeros(B, K - 1, D)
    extended = torch.cat([tail.to(inputs.dtype), inputs], dim=1)  # [B, K-1+T, D]
    out = bias.expand(B, T, D)
    for j in range(K):
        out = out + weight[j] * extended[:, K - 1 - j:K - 1 - j + T]
    return out, extended[:, T:]


class TrunkBlock(GradientCheckpointingLayer):
    """One block: integrator/conv mixer, then a GELU FFN, both pre-norm residual branches. Under
    `gradient_checkpointing_enable()` its forward is recomputed in the backward pass (it has no side effects:
    the state comes in and goes out as arguments)."""

    def __init__(self, config: KathleenConfig):
        super().__init__()
        d = config.d_model
        self.bands = config.decay_bands
        self._band_limits = None  # (lo, hi - lo) [D], derived from the config: not state, not saved
        self.mixer_norm = nn.LayerNorm(d)
        self.value_proj = nn.Linear(d, d)
        self.decay_proj = nn.Linear(d, d)  # bias starts at 0: the middle of each band
        self.mix_proj = nn.Linear(d, d)
        self.conv_weight = nn.Parameter(torch.randn(config.conv_kernel, d) * config.initializer_range)
        self.conv_bias = nn.Parameter(torch.zeros(d))
        self.out_proj = nn.Linear(d, d)
        self.ffn_norm = nn.LayerNorm(d)
        self.ffn_in = nn.Linear(d, config.ffn_ratio * d)
        self.ffn_out = nn.Linear(config.ffn_ratio * d, d)
        self.dropout_rate = config.dropout  # F.dropout, not a module: a module call costs time per decoded byte

    def decay(self, u: torch.Tensor, decay_logits: torch.Tensor | None = None) -> torch.Tensor:
        """γ [.., D] in fp32 from the normalised input u (or from W_a u, if already computed)."""
        if self._band_limits is None or self._band_limits[0].device != u.device:  # built once per device
            lo, hi = band_limits(u.shape[-1], self.bands, u.device)
            self._band_limits = lo, hi - lo
        lo, width = self._band_limits
        decay_logits = self.decay_proj(u) if decay_logits is None else decay_logits
        return torch.addcmul(lo, width, torch.sigmoid(decay_logits.float()))

    def input_projections(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """W_v u, W_a u, W_m u as one matrix product (one call instead of three: it shows per decoded byte).
        A projection that is more than its weights (a LoRA layer in its place, a hook on it) runs as itself."""
        projections = (self.value_proj, self.decay_proj, self.mix_proj)
        if any(type(p) is not nn.Linear or p._forward_hooks or p._forward_pre_hooks for p in projections):
            return tuple(p(u) for p in projections)
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections])
        return F.linear(u, weight, bias).chunk(3, dim=-1)

    def ffn(self, h: torch.Tensor) -> torch.Tensor:
        return self.ffn_out(gelu(self.ffn_in(self.ffn_norm(h))))

    def forward(
        self, h: torch.Tensor, valid: torch.Tensor | None, state: TrunkState | None = None
    ) -> tuple[torch.Tensor, TrunkState]:
        """h [B, T, D], valid [B, T] bool or None (all) -> (h [B, T, D], state after the last position)."""
        if h.shape[1] == 1 and valid is None and state is not None:
            return self.step(h, state)
        keep = None if valid is None else valid.unsqueeze(-1)  # [B, T, 1]
        u = self.mixer_norm(h) if keep is None else self.mixer_norm(h) * keep  # padding feeds zeros to the conv
        values, decay_logits, mix_logits = self.input_projections(u)
        gamma = self.decay(u, decay_logits)
        if keep is not None:
            gamma = torch.where(keep, gamma, 1.0)  # padding: γ = 1, the integrator holds
        s, integrator = linear_scan(gamma, (1.0 - gamma) * values.float(), None if state is None else
                                    state.integrator, output_final_state=True, chunk_size=TRUNK_SCAN_CHUNK)
        c, conv_tail = causal_depthwise_conv(
            u.float(), self.conv_weight.float(), self.conv_bias.float(), None if state is None else state.conv_tail
        )
        return self.mix_and_feed_forward(h, s, c, mix_logits), TrunkState(integrator, conv_tail)

    def step(self, h: torch.Tensor, state: TrunkState) -> tuple[torch.Tensor, TrunkState]:
        """One byte after `state` (decoding): `forward` at T = 1 without padding, in fewer ops. The scan is one
        lerp, s = γ s + (1 - γ) v, and the convolution one weighted sum over the window u_{t-K+1} .. u_t."""
        u = self.mixer_norm(h)
        values, decay_logits, mix_logits = self.input_projections(u)
        gamma = self.decay(u, decay_logits)
        s = torch.lerp(values.float(), state.integrator.unsqueeze(1), gamma)  # [B, 1, D]
        window = torch.cat([state.conv_tail, u.float()], dim=1)  # [B, K, D]: u_{t-K+1} .. u_t, oldest first
        c = (window * self.conv_weight.float().flip(0)).sum(1, keepdim=True) + self.conv_bias.float()
        return self.mix_and_feed_forward(h, s, c, mix_logits), TrunkState(s.squeeze(1), window[:, 1:])

    def mix_and_feed_forward(
        self, h: torch.Tensor, s: torch.Tensor, c: torch.Tensor, mix_logits: torch.Tensor
    ) -> torch.Tensor:
        """h + W_o (m ⊙ s + (1 - m) ⊙ c), then + FFN: the residual branches after the integrator and conv."""
        mixed = torch.lerp(c.to(h.dtype), s.to(h.dtype), torch.sigmoid(mix_logits).to(h.dtype))  # autocast: bf16
        h = h + self.dropped(self.out_proj(mixed))
        return h + self.dropped(self.ffn(h))

    def dropped(self, x: torch.Tensor) -> torch.Tensor:
        """Dropout in training; no call at all otherwise (it would cost time per decoded byte)."""
        return F.dropout(x, self.dropout_rate, True) if self.training and self.dropout_rate > 0 else x

    def forward_reference(
        self, h: torch.Tensor, valid: torch.Tensor | None, state: TrunkState | None = None
    ) -> tuple[torch.Tensor, TrunkState]:
        """The block equations one position at a time, in fp32: the oracle for `forward` (eval mode)."""
        B, T, D = h.shape
        valid = torch.ones(B, T, dtype=torch.bool, device=h.device) if valid is None else valid
        K = self.conv_weight.shape[0]
        zeros = h.new_zeros(B, D, dtype=torch.float32)
        s = zeros if state is None else state.integrator.clone()
        past_u = [zeros] * (K - 1) if state is None else list(state.conv_tail.unbind(1))
        outputs = []
        for t in range(T):
            ok = valid[:, t].unsqueeze(-1)
            h_t = h[:, t].float()
            u = torch.where(ok, self.mixer_norm(h_t), 0.0)
            gamma = self.decay(u)
            s = torch.where(ok, gamma * s + (1.0 - gamma) * self.value_proj(u), s)
            past_u.append(u)
            c = self.conv_bias + sum(self.conv_weight[j] * past_u[-1 - j] for j in range(K))
            m = torch.sigmoid(self.mix_proj(u))
            h_t = h_t + self.out_proj(m * s + (1.0 - m) * c)
            outputs.append(h_t + self.ffn(h_t))
            past_u = past_u[1:]
        return torch.stack(outputs, dim=1), TrunkState(s, torch.stack(past_u, dim=1))


class Trunk(nn.Module):
    """Byte embedding -> N blocks -> final LayerNorm. Returns the normalised hidden state for the head."""

    def __init__(self, config: KathleenConfig):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(TrunkBlock(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model)

    def forward(
        self,
        input_ids: torch.Tensor,
        valid: torch.Tensor | None,
        states: list[TrunkState] | None = None,
        reference: bool = False,
        hidden_states: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, list[TrunkState]]:
        """input_ids [B, T], valid [B, T] or None (all) -> (hidden [B, T, D], one state per block).

        `reference=True` runs every block through its sequential oracle. A `hidden_states` list receives the
        embedding and each block's output, the last one final-normed (Transformers' output_hidden_states).
        """
        h = self.embed(input_ids)
        new_states = []
        for i, block in enumerate(self.blocks):
            if hidden_states is not None:
                hidden_states.append(h)
            run = block.forward_reference if reference else block
            h, block_state = run(h, valid, None if states is None else states[i])
            new_states.append(block_state)
        h = self.final_norm(h)
        if hidden_states is not None:
            hidden_states.append(h)
        return h, new_states
