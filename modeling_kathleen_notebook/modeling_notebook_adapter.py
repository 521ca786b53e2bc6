"""The notebook on any trunk: a Transformers causal LM over the byte vocabulary, plus the notebook.

    bytes -> base causal LM (Llama, GPT-2, Mamba, ...) -> trunk_logits ─┐
          └-> Notebook (SPEC §3) ----------------------> memory_logits ┴-> logits = trunk_logits + memory_logits

The notebook reads nothing but the byte ids, so it attaches to any base model without touching its
inside. The state is a `NotebookAdapterCache`: the base model's own cache beside the notebook's.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoModelForCausalLM, GenerationMixin, PreTrainedModel

from .cache import NotebookAdapterCache
from .causal_lm import ByteCausalLM, KathleenCausalLMOutput, byte_inputs, kept_positions
from .checkpoint_io import SafeCheckpointMixin
from .configuration_notebook_adapter import NotebookAdapterConfig
from .modeling_kathleen import init_notebook
from .notebook import Notebook

ADAPTER_AUTO_MAP = {
    "AutoConfig": "configuration_notebook_adapter.NotebookAdapterConfig",
    "AutoModelForCausalLM": "modeling_notebook_adapter.NotebookAdapterForCausalLM",
}


class NotebookAdapterPreTrainedModel(SafeCheckpointMixin, PreTrainedModel):
    config_class = NotebookAdapterConfig
    remote_code_auto_map = ADAPTER_AUTO_MAP
    base_model_prefix = "model"  # no such attribute: the wrapper is its own base model
    main_input_name = "input_ids"
    _supports_param_buffer_assignment = False

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
