"""How loud a sure read speaks: the notebook's answer against the trunk's, weighed by statistics that name no phrasing.

The notebook's logits are s · read: a clean hit adds s nats to the stored byte. Where the trunk is surer of
something else (a fact's value after a sentence shape it never trained on), s nats lose, although the read ranks
the right byte first (reports/facts.md). The trunk can learn to defer through its hidden state, but what it
learns is tied to the phrasings it trained on. `ReadTrust` adds, per position,

    extra(b) = k · relu(z(b) - τ)     z: the read standardised over the vocabulary at this position
    k        = softplus(θ · φ)        φ = [1, log top z, log(1 + top z - second z), trunk entropy,
                                           trunk's largest log-probability, trunk's log-probability of z's top byte]

so a byte that stands far out of the crosstalk (a clean hit has z ≈ 16 among 259 ids, crosstalk stays below
about 3.5) gains nats in proportion to how far it stands out, more where the trunk is unsure. The linear read
itself passes less than c nats of crosstalk:

    linear   = read / sqrt(1 + (σ / c)²)   σ: the standard deviation of the read over every id but its largest

(≈ the read where σ ≪ c, ≈ c / σ times it where σ ≫ c; smooth, so c can be fitted by gradient.)

A memory that forgets slowly fills with the crosstalk of what it wrote, and without the cap every byte's logits
would carry it (σ of the shipped checkpoint's read grows from 0.08 nats in the first 2 KB of a stream to 0.4
after 64 KB: reports/facts.md); with it a full memory's read adds at most c nats of noise and speaks through z,
which does not depend on the read's scale. The read's
statistics enter k as logarithms: k then changes as a power of z, never exponentially, so a read cleaner than
any seen in the fit (a short document, an empty memory) is not silenced. Nothing in φ
depends on the words around a fact: what is fitted on training phrasings carries to new ones. θ and τ are
fitted with everything else frozen (`scripts/fit_read_trust.py`).

It acts on reads only, position by position: one step and a full forward agree, the memory state is
untouched (unlearning stays exact), and a row of zeros (padding, an empty memory) gains nothing. On a CPU in fp32
it is one compiled call (kernels.cpp's `read_trust`: as PyTorch ops a decoded byte's trust was some twenty small
calls, more than twice the rest of the step), and in training its backward another (`read_trust_backward`, in
`CompiledReadTrust`; `python scripts/throughput.py --notebook defaults` times both forms); `forward_reference` is
the oracle of both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_kathleen import UNBOUND_LOG_NOISE_CAP
from .kernels import fourier_kernels

FEATURES = ("bias", "log_top_z", "log_margin_z", "trunk_entropy", "trunk_top_logprob", "trunk_logprob_of_read")
READ_FEATURES = FEATURES[:3]  # the statistics of the read alone
INITIAL_BIAS = -4.0  # θ₀ of a new trust, its other weights 0: k = softplus(-4) ≈ 0.02 everywhere, almost silent
INITIAL_THRESHOLD = 3.0


def initial_weights(bias: float) -> torch.Tensor:
    """θ of a new trust: bias θ₀, every statistic's weight 0 (k = softplus(θ₀) at every position)."""
    return torch.tensor([bias] + [0.0] * (len(FEATURES) - 1))


def crosstalk_variance(reads: torch.Tensor) -> torch.Tensor:
    """σ² [..., 1]: the variance over the vocabulary of every read but the largest (a hit is no noise). The
    variance, not σ: the cap needs only σ², and √ has no gradient at an all-zero row."""
    reads = reads.float()
    n = reads.shape[-1] - 1
    top = reads.amax(-1, keepdim=True)
    mean = (reads.sum(-1, keepdim=True) - top) / n
    return (((reads * reads).sum(-1, keepdim=True) - top * top) / n - mean * mean).clamp_min(0.0)


def trust_features(reads: torch.Tensor, trunk_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """z [..., V] (reads standardised over the vocabulary) and φ [..., len(FEATURES)], both fp32."""
    reads = reads.float()
    z = (reads - reads.mean(-1, keepdim=True)) / reads.std(-1, keepdim=True).clamp_min(1e-6)
    top = z.topk(2, dim=-1).values
    logp = torch.log_softmax(trunk_logits.float(), dim=-1).expand_as(z)
    entropy = -(logp.exp() * logp).sum(-1)
    of_read = logp.gather(-1, z.argmax(-1, keepdim=True)).squeeze(-1)
    log_top, log_margin = top[..., 0].clamp_min(1e-3).log(), (1 + top[..., 0] - top[..., 1]).log()
    phi = torch.stack([torch.ones_like(entropy), log_top, log_margin, entropy, logp.amax(-1), of_read], dim=-1)
    return z, phi


class CompiledReadTrust(torch.autograd.Function):
    """kernels.cpp's read_trust with its hand-written backward (read_trust_backward): reads [M, V] and trunk_logits
    [M, V] fp32, contiguous, and the parameters θ, τ, log c -> the memory's logits [M, V]."""

    @staticmethod
    def forward(ctx, reads, trunk_logits, weights, threshold, log_noise_cap, kernels):
        ctx.kernels = kernels
        out, statistics = kernels.read_trust(reads, trunk_logits,
                                             *(p.detach() for p in (weights, threshold, log_noise_cap)), True)
        ctx.save_for_backward(reads, trunk_logits, statistics, weights, threshold, log_noise_cap)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        reads, trunk_logits, statistics, weights, threshold, log_noise_cap = ctx.saved_tensors
        grad_reads, grad_trunk, per_row = ctx.kernels.read_trust_backward(
            reads, trunk_logits, statistics, grad.contiguous(),
            *(p.detach() for p in (weights, threshold, log_noise_cap)))
        numbers = per_row.sum(0)
        return grad_reads, grad_trunk, numbers[:6], numbers[6].view_as(threshold), numbers[7].view_as(log_noise_cap), \
            None


class ReadTrust(nn.Module):
    """The linear read with its crosstalk held below c nats, plus extra nats for a sure read: k · relu(z - τ),
    k = softplus(θ · φ)."""

    def __init__(self, log_noise_cap: float = UNBOUND_LOG_NOISE_CAP, bias: float = INITIAL_BIAS):
        super().__init__()
        self.weights = nn.Parameter(initial_weights(bias))
        self.threshold = nn.Parameter(torch.tensor(INITIAL_THRESHOLD))
        self.log_noise_cap = nn.Parameter(torch.tensor(log_noise_cap))

    def forward(self, reads: torch.Tensor, trunk_logits: torch.Tensor) -> torch.Tensor:
        """reads [..., V] -> the memory's logits [..., V]; trunk_logits broadcast to reads' shape."""
        kernels = None
        if (reads.device.type == "cpu" and reads.dtype == torch.float32 and trunk_logits.dtype == torch.float32
                and reads.numel() and not torch.jit.is_tracing() and not torch.compiler.is_compiling()
                and not torch.compiler.is_exporting()):  # an export records the ops
            kernels = fourier_kernels()
        if kernels is None or not hasattr(kernels, "read_trust_backward"):
            return self.forward_reference(reads, trunk_logits)
        vocab = reads.shape[-1]
        # the broadcast trunk logits' gradient is summed back to their own shape by expand_as' and reshape's backward
        rows = reads.reshape(-1, vocab).contiguous()
        trunk_rows = trunk_logits.expand_as(reads).reshape(-1, vocab).contiguous()
        if torch.is_grad_enabled():
            trusted = CompiledReadTrust.apply(rows, trunk_rows, self.weights, self.threshold, self.log_noise_cap,
                                              kernels)
        else:
            trusted, _ = kernels.read_trust(rows, trunk_rows, self.weights.detach(), self.threshold.detach(),
                                            self.log_noise_cap.detach(), False)
        return trusted.view(reads.shape)

    def forward_reference(self, reads: torch.Tensor, trunk_logits: torch.Tensor) -> torch.Tensor:
        """`forward` as PyTorch ops (with autograd: the fit; the oracle of the compiled call)."""
        z, phi = trust_features(reads, trunk_logits)
        weights, threshold, log_noise_cap = (p.float() for p in (self.weights, self.threshold, self.log_noise_cap))
        k = F.softplus(phi @ weights).unsqueeze(-1)  # in fp32 whatever the model's dtype, as the features are
        # an all-zero row (padding, an empty memory) has σ = 0: factor 1, and z = 0 with τ ≥ 0 gains nothing
        linear = reads.float() * torch.rsqrt(1.0 + crosstalk_variance(reads) * torch.exp(-2.0 * log_noise_cap))
        return (linear + k * torch.relu(z - threshold.clamp_min(0.0))).to(reads.dtype)
