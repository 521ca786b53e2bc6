"""GELU for the model's feed-forward layers and write gate, cheap at the size of one decoded position."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Up to this many elements the broadcast route below is faster on a CPU (scripts/decode_latency.py measures
# the effect on decoding; at 4,096 elements the two routes cost the same here).
SMALL_GELU = 2048


def gelu(x: torch.Tensor) -> torch.Tensor:
    """F.gelu(x) (exact, erf form). On a CPU, PyTorch hands a contiguous fp32 tensor to oneDNN, whose per-call
    setup is most of the cost at decoding sizes (about 6 µs for 384 numbers, more with cold caches: three
    calls were ~8% of a decoded byte). A broadcast view is not contiguous, so ATen's own kernel (the same
    erf formula) computes a small tensor instead, twice over, in less time."""
    if torch.compiler.is_exporting() or x.device.type != "cpu" or x.numel() > SMALL_GELU:  # exporting: no size test
        return F.gelu(x)
    return F.gelu(x.unsqueeze(0).expand(2, *x.shape))[0]
