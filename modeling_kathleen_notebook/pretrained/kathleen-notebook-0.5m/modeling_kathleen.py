"""Transformers classes of the Kathleen model: the only file that knows `PreTrainedModel` and `generate`.

    bytes -> Trunk -> hidden -> lm_head -> trunk_logits ─┐
          └-> Notebook (or AttentionHead) -> memory_logits ┴-> logits = trunk_logits + memory_logits

The model reads and writes its recurrent state through a `KathleenCache`; padding (attention_mask 0)
leaves that state untouched, so a left-padded batch equals each row run alone.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.pytorch_utils import move_to_device
from transformers.utils import ModelOutput

from .attention import AttentionHead
from .cache import KathleenCache, config_fingerprint
from .causal_lm import (
    ByteCausalLM,
    KathleenCausalLMOutput,
    byte_inputs,
    fixed_vocabulary,
    kept_positions,
    valid_positions,
)
from .checkpoint_io import SafeCheckpointMixin
from .codebooks import make_codebooks
from .configuration_kathleen import KathleenConfig
from .decode_step import fused_step
from .greedy_generation import compiled_sample
from .notebook import Notebook
from .read_trust import INITIAL_THRESHOLD, ReadTrust, initial_weights
from .trunk import Trunk, TrunkBlock

REMOTE_CODE_AUTO_MAP = {
    "AutoConfig": "configuration_kathleen.KathleenConfig",
    "AutoModel": "modeling_kathleen.KathleenModel",
    "AutoModelForCausalLM": "modeling_kathleen.KathleenForCausalLM",
}


@dataclass
class KathleenModelOutput(ModelOutput):
    """last_hidden_state [B, T, D] (final-normed trunk output), memory_logits [B, T, V] or None (the
    notebook's read before the read trust; [B, T, 2V] with a trust per memory: `Notebook.combine`; the last
    logits_to_keep positions when that is a positive int), cache; trunk_logits [B, T, V] of every position when
    an lm_head was passed (a notebook that writes by the trunk's surprise needs them), and the notebook's write
    strengths β [B, T] when asked for; hidden_states (output_hidden_states): the embedding and each trunk block's
    output, n_layers + 1 tensors [B, T, D], the last equal to last_hidden_state."""

    last_hidden_state: torch.Tensor | None = None
    memory_logits: torch.Tensor | None = None
    cache: KathleenCache | None = None
    trunk_logits: torch.Tensor | None = None
    write_strengths: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


LORA_TARGET_MODULES = ["value_proj", "decay_proj", "mix_proj"]  # the trunk's input projections


def register_lora_targets() -> None:
    """PEFT's default LoRA targets for this model type (get_peft_model without target_modules), when PEFT is
    already imported: importing it here would cost seconds for every user who never uses it."""
    if "peft" in sys.modules:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as targets

        targets.setdefault(KathleenConfig.model_type, LORA_TARGET_MODULES)


class KathleenPreTrainedModel(SafeCheckpointMixin, PreTrainedModel):
    config_class = KathleenConfig
    remote_code_auto_map = REMOTE_CODE_AUTO_MAP
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["TrunkBlock"]
    supports_gradient_checkpointing = True  # the trunk's blocks (GradientCheckpointingLayer)
    _supports_param_buffer_assignment = False
    resize_token_embeddings = fixed_vocabulary  # bytes: the vocabulary never changes

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model builds its own KathleenCache (SPEC §7)

    def post_init(self) -> None:
        super().post_init()
        register_lora_targets()

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)  # linear/embedding normal(initializer_range), LayerNorm (1, 0)
        if isinstance(module, TrunkBlock):
            init.normal_(module.conv_weight, mean=0.0, std=self.config.initializer_range)
            init.zeros_(module.conv_bias)
        elif isinstance(module, Notebook):
            init_notebook(module, self.config)
        elif isinstance(module, ReadTrust):  # its own module: a checkpoint without one gets it initialised alone
            init.copy_(module.weights, initial_weights(self.config.read_trust_bias_init))
            init.constant_(module.threshold, INITIAL_THRESHOLD)
            # initialised alone in a trust saved before the cap existed (its config says None: unbound)
            init.constant_(module.log_noise_cap, self.config.initial_log_noise_cap)


def init_notebook(notebook: Notebook, config: KathleenConfig) -> None:
    """The notebook's initial read scales, forget logit, gate bias and fact bank shift, and its fixed codebooks
    (SPEC §3)."""
    init.constant_(notebook.read_scale, config.effective_read_scale_init)
    if config.fact_bank:
        init.constant_(notebook.fact_read_scale, config.effective_read_scale_init)
        init.constant_(notebook.fact_shift, config.fact_bank_shift_init)
    if config.repeat_key_window:
        init.constant_(notebook.repeat_read_scale, config.effective_read_scale_init)
    init.constant_(notebook.forget_logit, config.forget_logit_init)
    if notebook.gate is not None:
        init.constant_(notebook.gate.out.bias, config.gate_bias_init)
    if config.uses_surprise:
        init.constant_(notebook.surprise_scale, config.surprise_scale_init)
        init.constant_(notebook.surprise_shift, config.surprise_shift_init)
    for name, table in make_codebooks(config).items():
        init.copy_(getattr(notebook, name), table)


def refuse_attention_weights(kwargs: dict) -> None:
    """output_attentions=True asks for weights this model has none of (the trunk and the notebook attend to nothing;
    the attention arm's head does not return its weights): say so, rather than return outputs without them."""
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions=True: this model has no attention weights to return; "
                         "output_hidden_states=True gives the embedding and each block's output")


class KathleenModel(KathleenPreTrainedModel):
    """Trunk plus memory, no head: returns the trunk's hidden state and the memory's logit bias."""

    def __init__(self, config: KathleenConfig):
        super().__init__(config)
        self.trunk = Trunk(config)
        if config.memory == "notebook":
            self.memory = Notebook(config)
        elif config.memory == "attention":
            self.memory = AttentionHead(config)
        else:
            self.memory = None
        self.fingerprint = config_fingerprint(config)  # computed once: checked on every cached call
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.trunk.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.trunk.embed = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: KathleenCache | None = None,
        use_cache: bool | None = None,
        write_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_key_values: KathleenCache | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        return_dict: bool | None = None,
        lm_head: nn.Module | None = None,
        output_write_strengths: bool = False,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> KathleenModelOutput | tuple:
        """input_ids [B, T]; attention_mask [B, S ≥ T] (generate passes past + new: its last T columns
        count); write_mask [B, T] replaces the notebook's β;
        logits_to_keep = n > 0 returns memory logits of the last n positions only (the notebook then reads
        only those: prefill and reading a document into memory need no logits before the end);
        return_dict=False returns the output's fields as a tuple (a ModelOutput costs time per decoded byte);
        None follows config.return_dict, as Transformers' models do (PEFT passes None).
        lm_head: the byte head, applied to every position (trunk_logits) when given; a notebook that writes by
        the trunk's surprise cannot run without it. output_write_strengths returns the notebook's β;
        output_hidden_states (default config.output_hidden_states) the embedding and every block's output."""
        refuse_attention_weights(kwargs)
        cache = cache if cache is not None else past_key_values
        if cache is not None:
            cache.check_fingerprint(self.fingerprint)
        inputs = byte_inputs(input_ids, attention_mask, self.config.vocab_size, logits_to_keep, write_mask,
                             inputs_embeds, cache)
        ids, valid, first_read = inputs.ids, inputs.valid, inputs.first_read
        use_cache = self.config.use_cache if use_cache is None else use_cache

        past = cache if cache is not None and not cache.is_empty() else None
        wanted = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        all_hidden = [] if wanted else None
        hidden, trunk_states = self.trunk(ids, valid, None if past is None else past.trunk, hidden_states=all_hidden)
        trunk_logits = None if lm_head is None else lm_head(hidden)
        memory_logits, memory_state, write_strengths = None, None, None
        if isinstance(self.memory, Notebook):
            if self.config.uses_surprise and trunk_logits is None:
                raise ValueError("this model's notebook writes by the trunk's surprise and needs its byte head: use "
                                 "KathleenForCausalLM, or pass lm_head=")
            memory_logits, memory_state, write_strengths = self.memory(
                ids, valid, None if past is None else past.memory, write_mask=write_mask, first_read=first_read,
                trunk_logits=trunk_logits, output_write_strengths=True)
        elif isinstance(self.memory, AttentionHead):
            memory_logits, memory_state = self.memory(hidden, valid, None if past is None else past.memory)
            memory_logits = memory_logits[:, first_read:]

        if use_cache:
            cache = cache if cache is not None else KathleenCache(self.config)
            cache.trunk, cache.memory = trunk_states, memory_state
            cache.seen_tokens += ids.shape[1]
        all_hidden = None if all_hidden is None else tuple(all_hidden)
        fields = (hidden, memory_logits, cache if use_cache else None, trunk_logits,
                  write_strengths if output_write_strengths else None, all_hidden)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return KathleenModelOutput(*fields) if return_dict else fields


class KathleenForCausalLM(KathleenPreTrainedModel, ByteCausalLM, GenerationMixin):
    """Kathleen trunk + memory + byte head, for `generate`, `pipeline` and training."""

    _tied_weights_keys: dict[str, str] = {}

    def __init__(self, config: KathleenConfig):
        super().__init__(config)
        self.model = KathleenModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        self.generation_config = self.default_generation_config()

    def new_cache(self) -> KathleenCache:
        return KathleenCache(self.config)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.trunk.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.trunk.embed = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def _sample(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                streamer=None, **model_kwargs):
        """GenerationMixin's loop for greedy search and sampling; a greedy call that needs nothing else of it runs its
        bytes in one compiled call (greedy_generation.py), with the same result."""
        compiled = compiled_sample(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                                   streamer, model_kwargs)
        if compiled is not None:
            return compiled
        return super()._sample(input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                               streamer, **model_kwargs)

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.LongTensor,
        next_sequence_length: int | None = None,
        cache: KathleenCache | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        is_first_iteration: bool | None = False,
        **kwargs,
    ) -> dict:
        """GenerationMixin's, for a byte model: the new ids, the cache, the mask and every other keyword but labels
        (no position ids, 4-D masks or embeddings: forward refuses those with a message), without the signature
        inspection and parameter walk it does at every step."""
        if next_sequence_length is not None:
            if next_sequence_length < 1:  # Transformers would slice the ids to nothing and forward fail on that
                raise ValueError(
                    f"the cache has already read {input_ids.shape[1] - next_sequence_length} bytes per row and "
                    f"input_ids holds {input_ids.shape[1]}: pass the whole sequence so far (the bytes the cache read, "
                    "then the new ones; after a generate call, its output and more), as with any Transformers cache")
            input_ids = input_ids[:, -next_sequence_length:]
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, **kwargs}
        inputs.pop("labels", None)
        if cache is not None:
            inputs["cache"] = cache
        if inputs_embeds is not None:
            inputs["inputs_embeds"] = inputs_embeds
        device = self.lm_head.weight.device
        return inputs if input_ids.device == device else move_to_device(inputs, device)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: KathleenCache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        write_mask: torch.Tensor | None = None,
        return_dict: bool | None = None,
        output_write_strengths: bool = False,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> KathleenCausalLMOutput | tuple:
        """As `KathleenModel.forward`, plus labels [B, T] (shifted inside; -100 is ignored) and
        logits_to_keep (0: all positions; n: the last n; a tensor: those positions)."""
        refuse_attention_weights(kwargs)
        cache = cache if cache is not None else kwargs.pop("past_key_values", None)
        if self.records(cache, use_cache):
            if (labels is None and write_mask is None and not output_write_strengths and input_ids is not None
                    and not (self.config.output_hidden_states if output_hidden_states is None
                             else output_hidden_states)):
                return self.forward_recording(input_ids, attention_mask, cache, logits_to_keep, return_dict, **kwargs)
            cache.recorded = {}  # a forward that does not record: crop cannot go back over it
        fused = self.fused_decoding(input_ids, attention_mask, cache, use_cache, labels, logits_to_keep, write_mask,
                                    output_write_strengths, output_hidden_states)
        if fused is not None:  # its memory logits have been through the read trust already
            logits, trunk_logits, memory_logits, cache = fused
            return self.causal_lm_output(input_ids, trunk_logits, memory_logits, None, None, return_dict, cache=cache,
                                         logits=logits)
        notebook = self.model.memory if isinstance(self.model.memory, Notebook) else None
        surprise = self.config.memory == "notebook" and self.config.uses_surprise  # the notebook needs every logit
        hidden, memory_logits, cache, all_trunk_logits, write_strengths, hidden_states = self.model(
            input_ids, attention_mask=attention_mask, cache=cache, use_cache=use_cache, write_mask=write_mask,
            logits_to_keep=logits_to_keep, return_dict=False, lm_head=self.lm_head if surprise else None,
            output_write_strengths=output_write_strengths, output_hidden_states=output_hidden_states, **kwargs)
        keep = kept_positions(logits_to_keep)
        trunk_logits = self.lm_head(hidden[:, keep]) if all_trunk_logits is None else all_trunk_logits[:, keep]
        memory_logits = None if memory_logits is None else memory_logits[:, keep]  # n kept: already n long
        return self.causal_lm_output(input_ids, trunk_logits, memory_logits, notebook, labels, return_dict,
                                     cache=cache, write_strengths=write_strengths, hidden_states=hidden_states)

    def fused_decoding(
        self, input_ids, attention_mask, cache, use_cache, labels, logits_to_keep, write_mask, output_write_strengths,
        output_hidden_states,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, KathleenCache] | None:
        """One decoded byte by decode_step.py's compiled call, where it applies: a single new byte per sequence
        after a cache that has read something, no padding in it, and nothing asked for that only the PyTorch path
        gives (labels, an oracle write mask, write strengths, hidden states). None: the PyTorch path runs (and
        checks the ids: the compiled call declines ids outside the vocabulary)."""
        if (input_ids is None or input_ids.dim() != 2 or input_ids.shape[1] != 1 or cache is None
                or use_cache is False or labels is not None or write_mask is not None or output_write_strengths
                or (self.config.output_hidden_states if output_hidden_states is None else output_hidden_states)
                or not isinstance(logits_to_keep, int) or not isinstance(cache, KathleenCache)):
            return None
        if valid_positions(input_ids, attention_mask) is not None:  # padding in the step
            return None
        step = fused_step(self, input_ids, cache)
        return None if step is None else (*step, cache)
