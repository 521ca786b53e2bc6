"""The notebook on any trunk: a Transformers causal LM over the byte vocabulary, plus the notebook.

    bytes -> base causal LM (Llama, GPT-2, Mamba, ...) -> trunk_logits ─┐
          └-> Notebook (SPEC §3) ----------------------> memory_logits ┴-> logits = trunk_logits + memory_logits

The notebook reads nothing but the byte ids, so it attaches to any base model without touching its
inside. The state is a `NotebookAdapterCache`: the base model's own cache beside the notebook's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable

import torch
from torch import nn
from transformers import AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer

from .cache import (
    CACHE_FORMAT_VERSION,
    RecurrentCache,
    config_fingerprint,
    current_names,
    map_state,
    read_safetensors,
    save_safetensors,
)
from .causal_lm import ByteCausalLM, KathleenCausalLMOutput, byte_inputs, fixed_vocabulary, kept_positions
from .checkpoint_io import SafeCheckpointMixin
from .configuration_notebook_adapter import NotebookAdapterConfig
from .modeling_kathleen import init_notebook
from .notebook import Notebook, NotebookState

ADAPTER_AUTO_MAP = {
    "AutoConfig": "configuration_notebook_adapter.NotebookAdapterConfig",
    "AutoModelForCausalLM": "modeling_notebook_adapter.NotebookAdapterForCausalLM",
}


# ---- the state: the base model's cache beside the notebook's -------------------------------------


class NotebookAdapterCache(RecurrentCache):
    """State of a `NotebookAdapterForCausalLM`: the base model's own cache (grown and read only by the
    base model) beside the notebook's constant-size state. It goes back over bytes (assisted and prompt-lookup
    decoding) where the base model's cache can: a crop restores a kept notebook state and crops the base cache."""

    def __init__(self, base: Cache | None = None, notebook: NotebookState | None = None, seen_tokens: int = 0):
        super().__init__(seen_tokens)
        self.base = base
        self.notebook = notebook

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.notebook = map_state(self.notebook, fn)
        self.recorded = {position: map_state(state, fn) for position, state in self.recorded.items()}

    @property
    def batch_size(self) -> int | None:
        return None if self.notebook is None else self.notebook.tail.shape[0]

    def inner_caches(self) -> list[Cache]:
        return [] if self.base is None else [self.base]

    def reset(self) -> None:
        self.base, self.notebook = None, None
        super().reset()

    @property
    def is_croppable(self) -> bool:
        """Where the base model's cache can drop its last rows: all its layers are plain key/value layers (a
        recurrent base's are not). True before the base model made its cache: Transformers asks before the first
        forward, and again after it."""
        return self.base is None or all(type(layer) is DynamicLayer for layer in self.base.layers)

    def kept_state(self) -> NotebookState | None:
        return map_state(self.notebook, torch.clone)

    def restore(self, state: NotebookState | None, tokens_to_remove: int) -> None:
        self.notebook = state
        self.base.crop(tokens_to_remove)

    # ---- on disk: the notebook's fields, and every tensor and flag of the base cache's layers -------------

    def save(self, path: str | os.PathLike, config) -> None:
        """Write the state to `path` (safetensors, atomic); `config` is the adapter's (its fingerprint goes in).
        The base model's cache is stored layer by layer as Transformers keeps it (keys and values, or a
        recurrent model's conv and SSM states): what a `DynamicCache` of that config holds."""
        if self.base is None:
            raise ValueError("the cache is empty: read some text before saving it")
        tensors, flags = {}, []
        for i, layer in enumerate(self.base.layers):
            layer_flags = {"class": type(layer).__name__}
            for name, value in vars(layer).items():
                entries = value.items() if isinstance(value, dict) else [(None, value)]
                for key, item in entries:
                    where = name if key is None else f"{name}.{key}"
                    if isinstance(item, torch.Tensor):
                        tensors[f"base.{i}.{where}"] = item.detach().contiguous().cpu()
                    elif isinstance(item, bool | int | float | str) or item is None:
                        layer_flags[where] = item
                    elif isinstance(item, torch.dtype):
                        layer_flags[where] = {"dtype": str(item).removeprefix("torch.")}
            flags.append(layer_flags)
        for f in dataclasses.fields(NotebookState) if self.notebook is not None else []:
            value = getattr(self.notebook, f.name).detach().contiguous().cpu()
            tensors[f"notebook.{f.name}"] = torch.view_as_real(value) if value.is_complex() else value
        metadata = {"format": "kathleen-adapter-cache", "format_version": str(CACHE_FORMAT_VERSION),
                    "config_fingerprint": adapter_fingerprint(config), "seen_tokens": str(self.seen_tokens),
                    "base_layers": json.dumps(flags)}
        save_safetensors(tensors, path, metadata)

    @classmethod
    def load(cls, path: str | os.PathLike, config, device: torch.device | str = "cpu") -> NotebookAdapterCache:
        """Read a cache written by `save` for a model of this `config`; a foreign, truncated or corrupted
        file, or one whose layers this version of Transformers lays out differently, raises `ValueError`."""
        from transformers import DynamicCache

        tensors, metadata = read_safetensors(path, "kathleen-adapter-cache", device)
        tensors = current_names(tensors, metadata, str(path))
        if metadata.get("config_fingerprint") != adapter_fingerprint(config):
            raise ValueError(f"{path} was saved by an adapter with another config (fingerprint "
                             f"{metadata.get('config_fingerprint')}, this one's {adapter_fingerprint(config)})")
        base, flags = DynamicCache(config=config.base_config), json.loads(metadata["base_layers"])
        if [type(layer).__name__ for layer in base.layers] != [f["class"] for f in flags]:
            raise ValueError(f"{path}'s base cache has layers {[f['class'] for f in flags]}, this Transformers "
                             f"builds {[type(layer).__name__ for layer in base.layers]}")
        for i, (layer, layer_flags) in enumerate(zip(base.layers, flags)):
            for name, value in vars(layer).items():
                keys = list(value) if isinstance(value, dict) else [None]
                for key in keys:
                    where = name if key is None else f"{name}.{key}"
                    if f"base.{i}.{where}" in tensors:
                        item = tensors[f"base.{i}.{where}"]
                    elif where in layer_flags:
                        item = layer_flags[where]
                        item = getattr(torch, item["dtype"]) if isinstance(item, dict) else item
                    elif name == "device":
                        item = torch.device(device)
                    else:
                        continue
                    if key is None:
                        setattr(layer, name, item)
                    else:
                        value[key] = item
        notebook = None
        if "notebook.spectrum" in tensors:
            fields = {f.name: tensors.get(f"notebook.{f.name}") for f in dataclasses.fields(NotebookState)}
            fields["spectrum"] = torch.view_as_complex(fields["spectrum"].contiguous())
            for bank in ("fact_spectrum", "repeat_spectrum"):  # None in a cache saved before such banks
                spectrum = fields[bank]
                fields[bank] = fields["spectrum"][:, :0] if spectrum is None else torch.view_as_complex(
                    spectrum.contiguous())
            notebook = NotebookState(**fields)
        return cls(base, notebook, int(metadata.get("seen_tokens", 0)))


def adapter_fingerprint(config) -> str:
    """A short hash of what a `NotebookAdapterConfig`'s state depends on: the base model's architecture and the
    notebook's settings (not names, paths or versions)."""
    volatile = {"transformers_version", "_name_or_path", "architectures", "dtype", "torch_dtype", "auto_map"}
    base = {k: v for k, v in config.base_config.to_dict().items() if k not in volatile}
    described = json.dumps({"base": base, "notebook": config_fingerprint(config.notebook_config)}, sort_keys=True,
                           default=str)
    return hashlib.sha256(described.encode()).hexdigest()[:16]


# ---- the model -------------------------------------------------------------------------------


class NotebookAdapterPreTrainedModel(SafeCheckpointMixin, PreTrainedModel):
    config_class = NotebookAdapterConfig
    remote_code_auto_map = ADAPTER_AUTO_MAP
    base_model_prefix = "model"  # no such attribute: the wrapper is its own base model
    main_input_name = "input_ids"
    _supports_param_buffer_assignment = False
    resize_token_embeddings = fixed_vocabulary  # bytes: the vocabulary never changes

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the wrapper builds a NotebookAdapterCache around the base model's cache

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)  # the notebook's gate; the base model initialises itself
        if isinstance(module, Notebook):
            init_notebook(module, self.config.notebook_config)


class NotebookAdapterForCausalLM(NotebookAdapterPreTrainedModel, ByteCausalLM, GenerationMixin):
    """A base causal LM (built from `config.base_config`) whose logits get the notebook's logit bias."""

    _tied_weights_keys: dict[str, str] = {}

    def __init__(self, config: NotebookAdapterConfig):
        super().__init__(config)
        self.trunk = AutoModelForCausalLM.from_config(config.base_config)
        self.notebook = Notebook(config.notebook_config) if config.memory == "notebook" else None
        self.post_init()
        self.generation_config = self.default_generation_config()

    def new_cache(self) -> NotebookAdapterCache:
        return NotebookAdapterCache()  # the base model fills its part on the first call

    def get_input_embeddings(self) -> nn.Module:
        return self.trunk.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.trunk.set_input_embeddings(value)

    def prepare_inputs_for_generation(self, *args, **kwargs) -> dict:
        # the base model knows what its forward wants while generating (Mamba drops the mask after the prompt)
        return self.trunk.prepare_inputs_for_generation(*args, **kwargs)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: NotebookAdapterCache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        write_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> KathleenCausalLMOutput | tuple:
        """As `KathleenForCausalLM.forward`: input_ids [B, T], attention_mask [B, S ≥ T], labels,
        logits_to_keep, write_mask [B, T] (replaces the notebook's β); position_ids go to the base model.
        trunk_logits are the base model's logits."""
        if cache is not None and not isinstance(cache, NotebookAdapterCache):
            raise ValueError(f"the adapter's cache must be a NotebookAdapterCache, got {type(cache).__name__}")
        if self.records(cache, use_cache):
            if (labels is None and write_mask is None and input_ids is not None and inputs_embeds is None
                    and not kwargs.get("output_hidden_states") and not kwargs.get("output_attentions")):
                return self.forward_recording(input_ids, attention_mask, cache, logits_to_keep, return_dict,
                                              position_ids=position_ids, **kwargs)
            cache.recorded = {}  # a forward that does not record: crop cannot go back over it
        inputs = byte_inputs(input_ids, attention_mask, self.config.vocab_size, logits_to_keep, write_mask,
                             inputs_embeds, cache)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = self.new_cache()

        surprise = self.notebook is not None and self.config.notebook_config.uses_surprise  # every logit needed
        base = self.trunk(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          cache=None if cache is None else cache.base, use_cache=use_cache,
                          logits_to_keep=0 if surprise else logits_to_keep, return_dict=True, **kwargs)
        keep = kept_positions(logits_to_keep)
        trunk_logits = base.logits[:, keep] if surprise else base.logits
        memory_logits, notebook_state = None, None
        if self.notebook is not None:
            memory_logits, notebook_state = self.notebook(
                inputs.ids, inputs.valid, None if cache is None else cache.notebook, write_mask=write_mask,
                first_read=inputs.first_read, trunk_logits=base.logits if surprise else None)
            memory_logits = memory_logits[:, keep]  # n kept: it read the last n only
        if use_cache:
            cache.base, cache.notebook = base.cache, notebook_state
            cache.seen_tokens += input_ids.shape[1]
        return self.causal_lm_output(input_ids, trunk_logits, memory_logits, self.notebook, labels, return_dict,
                                     cache=cache if use_cache else None)
