"""One decoded byte of `KathleenForCausalLM` in one compiled call (kernels.cpp's `decode_step`).

A decoded byte is about half a million multiply-adds (trunk) and a few passes over the notebook's F bins, but as
PyTorch ops it is some eighty small calls, and their dispatch, not their arithmetic, was most of its time. Here
the trunk's blocks, final norm and head, the notebook's β (gate and/or surprise), keep factor, keys, write and read
(a repeat bank's too), and the read trust when the model has one (the repeat bank's own too), are one C++ call:
the trunk's linear layers as products over the rows (from 4 rows on: each weight read once per byte, not once per
row), the rest a loop per sequence.

    fused_step(model, input_ids, cache)  -> (logits, trunk_logits, memory_logits or None), each [B, 1, V], or None
                                            (memory_logits through the read trust, where the model has one;
                                            logits = trunk_logits + memory_logits)

It applies in eval mode without autograd, on a CPU in fp32, to a cache that has read something, with no padding in
the step, ids in the vocabulary and a notebook with the Fourier read (or no memory), at any batch size; anything
else returns None and the PyTorch step runs (and raises what a bad input deserves). The PyTorch step stays
the oracle: the tests hold this path to it and to the full forward (fp32, 1e-4).
KATHLEEN_FUSED_DECODE=0 switches it off.
"""

from __future__ import annotations

import os
import weakref
from itertools import chain
from operator import is_

import torch
from torch import nn

from .kernels import fourier_kernels
from .notebook import NotebookState
from .read_out import FourierReadOut
from .trunk import TrunkState

PLAIN = (nn.Linear, nn.LayerNorm, nn.Embedding)
END = object()


def enabled() -> bool:
    return os.environ.get("KATHLEEN_FUSED_DECODE", "1") != "0"


def plain(module: nn.Module) -> bool:
    """A layer that is only its weights: no LoRA layer or other wrapper in its place, no hook on it."""
    return type(module) in PLAIN and not (module._forward_hooks or module._forward_pre_hooks)


def block_layers(block: nn.Module) -> list[nn.Module]:
    return [block.mixer_norm, block.value_proj, block.decay_proj, block.mix_proj, block.out_proj, block.ffn_norm,
            block.ffn_in, block.ffn_out]


def trunk_tensors(model: nn.Module) -> list[torch.Tensor] | None:
    """The trunk's weights in kernels.cpp's order (embed, final norm, head, band limits, then 18 per block), or None
    where a layer is not plain, the layer norms differ in eps, or the weights are not fp32 CPU tensors."""
    trunk, head = model.model.trunk, model.lm_head
    layers = [trunk.embed, trunk.final_norm, head] + [layer for block in trunk.blocks for layer in block_layers(block)]
    norms = [layer for layer in layers if isinstance(layer, nn.LayerNorm)]
    if not all(map(plain, layers)) or head.bias is not None or len({n.eps for n in norms}) != 1:
        return None
    lo, width = band_limits(trunk.blocks[0], trunk.embed.weight)
    tensors = [trunk.embed.weight, trunk.final_norm.weight, trunk.final_norm.bias, head.weight, lo, width]
    for block in trunk.blocks:
        norm, value, decay, mix, out, ffn_norm, ffn_in, ffn_out = block_layers(block)
        for layer in (norm, value, decay, mix):
            tensors += [layer.weight, layer.bias]
        tensors += [block.conv_weight, block.conv_bias]
        for layer in (out, ffn_norm, ffn_in, ffn_out):
            tensors += [layer.weight, layer.bias]
    return tensors if fp32_cpu(tensors) else None


def fp32_cpu(tensors: list[torch.Tensor]) -> bool:
    """Whether every tensor is what the kernels read: fp32 on the CPU."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def band_limits(block: nn.Module, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's (lo, hi - lo) of γ, as its own `decay` builds and keeps them."""
    if block._band_limits is None or block._band_limits[0].device != weight.device:
        block.decay(weight.new_zeros(1, weight.shape[1]))
    return block._band_limits


def notebook_parameters(notebook: nn.Module) -> list[torch.Tensor] | None:
    """The notebook's trained numbers in kernels.cpp's order (read scale, forget logit, surprise scale and shift,
    the gate's five tensors, the read trust's three, a repeat bank's read scale and its own trust's three; empty
    tensors for what the config lacks), or None where the gate is wrapped or the notebook has a fact bank (the
    kernel holds the first memory and a repeat bank)."""
    if notebook.config.fact_bank:
        return None
    none = torch.empty(0)
    gate = notebook.gate
    if gate is None:
        gates = [none] * 5
    elif all(map(plain, (gate.embed, gate.out))) and type(gate.conv) is nn.Conv1d and not gate.conv._forward_hooks:
        gates = [gate.embed.weight, gate.conv.weight, gate.conv.bias, gate.out.weight, gate.out.bias]
    else:
        return None
    surprise = [notebook.surprise_scale, notebook.surprise_shift] if notebook.config.uses_surprise else [none, none]
    trusts = [trust_parameters(trust) for trust in (notebook.trust, notebook.repeat_trust)]
    repeat_scale = notebook.repeat_read_scale if notebook.config.repeat_key_window else none
    return [notebook.read_scale, notebook.forget_logit, *surprise, *gates, *trusts[0], repeat_scale, *trusts[1]]
    # the parameters, not copies: a cast and back (.double().float()) gives them new storage, which a copy would miss


def trust_parameters(trust: nn.Module | None) -> list[torch.Tensor]:
    """A read trust's θ, τ and log c, or three empty tensors without one."""
    if trust is None:
        return [torch.empty(0)] * 3
    return [trust.weights, trust.threshold, trust.log_noise_cap]


class DecodeWeights:
    """What `fused_step` hands the kernel, listed once per model (a walk over the modules costs more than the
    kernel), with what it takes to notice when it goes stale: every module and parameter slot it came from (a LoRA
    layer or a new parameter put in their place) and every hook dict (a hook registered later). `kernels` is None
    where the compiled step does not apply to this model."""

    def __init__(self, model: nn.Module):
        memory = model.config.memory
        self.notebook = model.model.memory if memory == "notebook" else None
        self.trunk = trunk_tensors(model)
        self.notebook_parameters = None if self.notebook is None else notebook_parameters(self.notebook)
        self.eps = model.model.trunk.final_norm.eps
        self.fingerprint = model.model.fingerprint  # the config's, fixed at build: read here once, not per byte
        kernels = fourier_kernels()
        applies = (memory in ("notebook", "none") and self.trunk is not None and kernels is not None
                   and hasattr(kernels, "decode_step") and (self.notebook is None or self.notebook_parameters))
        self.kernels = kernels if applies else None
        modules = [model, *model.model.modules(), model.lm_head]
        # live views of every slot, and an end mark: a slot that gains or loses an entry shifts the mark
        self.slots = [m._modules.values() for m in modules] + [m._parameters.values() for m in modules] + [(END,)]
        self.items = list(chain.from_iterable(self.slots))  # held, so none of them can be freed and replaced
        # the model's own hooks still run around its forward; those of the modules the kernel stands in for do not
        self.hooks = [d for m in modules[1:] for d in (m._forward_hooks, m._forward_pre_hooks)]

    def __reduce__(self):
        """A copy or a pickle of the model gets no cache (it holds the compiled kernels' module, which neither can
        copy): the copy lists its own weights at its first decoded byte."""
        return type(None), ()

    def current(self) -> bool:
        """Every slot holds the very object it held (C-level maps: this runs at every decoded byte), and no hook was
        added."""
        return all(map(is_, chain.from_iterable(self.slots), self.items)) and not any(map(len, self.hooks))

    @classmethod
    def of(cls, model: nn.Module) -> DecodeWeights:
        weights = model.__dict__.get("_decode_weights")
        if weights is None or not weights.current():
            weights = cls(model)
            model.__dict__["_decode_weights"] = weights  # not a module attribute: never saved or moved
        return weights


def notebook_inputs(notebook: nn.Module, parameters: list[torch.Tensor], cache) -> tuple[list, list] | None:
    """The notebook's state, tables, parameters and key memos in kernels.cpp's order, and its numbers; None where the
    kernel does not apply (a read-out other than the Fourier one, a state that is not complex64)."""
    tables, state = notebook.tables(), cache.memory
    reader, settings = tables.reader, notebook.config
    if not isinstance(reader, FourierReadOut) or state.spectrum.dtype != torch.complex64:
        return None
    # bound keys: slot frequencies [W, F] as int16 residues and the Q roots of unity; bundled: role rows, row offsets
    roots = tables.roots if tables.bound else tables.write_values.new_empty(0)
    keys = tables.key_residues if tables.bound else tables.key_rows
    repeat_keys = notebook.repeat_tables().key_residues if settings.repeat_key_window else keys.new_empty(0)
    tensors = [state.spectrum.resolve_conj().contiguous(), state.tail.contiguous(), state.last_logits.contiguous(),
               keys, tables.row_offsets, roots, tables.write_values, reader.frequencies, *parameters, repeat_keys,
               state.repeat_spectrum.resolve_conj().contiguous()]
    windows = [settings.key_window] + ([settings.repeat_key_window] if settings.repeat_key_window else [])
    memo = key_memo(cache, tables, windows, state.spectrum.shape[0], state.spectrum.shape[1])
    tensors += memo + [keys.new_empty(0)] * (4 - len(memo))
    numbers = [reader.period, reader.gain, float(settings.forgetting), settings.forget_max, settings.keep_clamp,
               settings.key_window, settings.gate_window if notebook.gate is not None else 0,
               float(settings.uses_surprise), settings.repeat_key_window]
    return tensors, numbers


def key_memo(cache, tables, windows: list[int], batch: int, bins: int) -> list[torch.Tensor]:
    """The cache's key memos (kernels.cpp's KeyMemo: each memory's last read key, which is the next byte's write
    key), for memories of these key windows: per memory ids [B, W] (-1: no key yet) and keys [B, 2F + 1]. Made anew
    where missing, of other shapes, or formed from other key tables than `tables` (another model's, or these
    reloaded); a batch reordered in place keeps them, as each row's ids say whether its key is still the one asked
    for."""
    made_from, memo = cache.key_memo or (None, [])
    shapes = [shape for window in windows for shape in ((batch, window), (batch, 2 * bins + 1))]
    if made_from is None or made_from() is not tables or [tuple(t.shape) for t in memo] != shapes:
        memo = [torch.full(shape, -1, dtype=torch.int64) if i % 2 == 0 else torch.zeros(shape)
                for i, shape in enumerate(shapes)]
        cache.key_memo = (weakref.ref(tables), memo)  # weak: a cache does not keep a reloaded model's tables alive
    return memo


def reads_in_kernel(model: nn.Module) -> bool:
    """Whether the compiled step takes this model's bytes, whatever its cache: the kernels built, plain fp32 CPU
    layers, and no notebook or one with the Fourier read (another read-out takes the PyTorch step). The weights are
    checked again here: `model.to(dtype or device)` converts them in place, so the listing stays current."""
    weights = DecodeWeights.of(model)
    return (weights.kernels is not None and fp32_cpu(weights.trunk + (weights.notebook_parameters or []))
            and (weights.notebook is None or isinstance(weights.notebook.tables().reader, FourierReadOut)))


def kernel_inputs(model: nn.Module, input_ids: torch.Tensor, cache) -> tuple[DecodeWeights, list, list, list] | None:
    """What the compiled calls take for this model, batch and cache: the listed weights, the trunk's state, the
    notebook's state and tables, and the numbers; None where the compiled step does not apply. A cache of another
    model's config, or of another batch size, raises a `ValueError`."""
    if (not enabled() or torch.is_grad_enabled() or model.training or cache is None or cache.is_empty()
            or input_ids.device.type != "cpu" or input_ids.dtype != torch.int64):
        return None
    weights = DecodeWeights.of(model)
    cache.check_fingerprint(weights.fingerprint)
    cache.check_batch_size(input_ids.shape[0])
    if weights.kernels is None:
        return None
    states = [t.contiguous() for s in cache.trunk for t in (s.integrator, s.conv_tail)]  # prefill leaves views
    notebook, numbers = [], [weights.eps]
    if weights.notebook is not None:
        found = notebook_inputs(weights.notebook, weights.notebook_parameters, cache)
        if found is None:
            return None
        notebook, more = found
        numbers += more
    return weights, states, notebook, numbers


def store_state(weights: DecodeWeights, cache, moved: list[torch.Tensor], bytes_read: int) -> None:
    """Put the state a compiled call returned (per block integrator and conv tail, then the notebook's) in the
    cache."""
    n = 2 * len(cache.trunk)
    cache.trunk = [TrunkState(integrator, tail) for integrator, tail in zip(moved[:n:2], moved[1:n:2])]
    cache.seen_tokens += bytes_read
    if weights.notebook is not None:  # spectrum, tail, last logits, and a repeat bank's spectrum
        spectrum, tail, last_logits, *repeat = moved[n:]
        cache.memory = NotebookState(spectrum, tail, last_logits, fact_spectrum=cache.memory.fact_spectrum,
                                     repeat_spectrum=repeat[0] if repeat else cache.memory.repeat_spectrum)


def fused_step(
    model: nn.Module, input_ids: torch.Tensor, cache
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """Logits, trunk logits and the notebook's read [B, 1, V] (None without a notebook) of one decoded byte [B, 1],
    with the cache moved on; or None, the cache untouched, where the compiled step does not apply. A cache of
    another model's config, or of another batch size, raises a `ValueError`."""
    inputs = kernel_inputs(model, input_ids, cache)
    if inputs is None:
        return None
    weights, states, notebook, numbers = inputs
    out = weights.kernels.decode_step(weights.trunk, states, input_ids.contiguous(), notebook, numbers)
    if not out:  # an id outside the vocabulary, or a weight or the state not fp32 (cast since the weights were listed)
        return None
    logits, trunk_logits, memory_logits, _, *moved = out
    store_state(weights, cache, moved, 1)
    return logits, trunk_logits, None if weights.notebook is None else memory_logits


def greedy_bytes(
    model: nn.Module, last_ids: torch.Tensor, cache, steps: int, eos: torch.Tensor, pad: int, unfinished: torch.Tensor
) -> torch.Tensor | None:
    """Up to `steps` greedy bytes [B, n] after last_ids [B, 1], which are read first, in one compiled call
    (kernels.cpp's decode_greedy): a finished sequence gets `pad`, a byte in `eos` finishes its sequence
    (`unfinished` [B] int64 is updated in place), and the call ends once all have finished. The cache has read
    last_ids and every byte but the last. None, the cache untouched, where the compiled step does not apply."""
    inputs = kernel_inputs(model, last_ids, cache)
    if inputs is None or not hasattr(inputs[0].kernels, "decode_greedy"):
        return None
    weights, states, notebook, numbers = inputs
    out = weights.kernels.decode_greedy(weights.trunk, states, last_ids.contiguous(), notebook, numbers, steps,
                                        eos, pad, unfinished)
    if not out:
        return None
    chosen, *moved = out
    store_state(weights, cache, moved, chosen.shape[1])
    return chosen
