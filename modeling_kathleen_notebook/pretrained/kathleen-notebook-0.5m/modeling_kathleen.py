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
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from .attention import AttentionHead
from .cache import KathleenCache, config_fingerprint
from .checkpoint_io import SafeCheckpointMixin
from .configuration_kathleen import PAD_ID, KathleenConfig
from .notebook import Notebook, make_codebooks
from .read_trust import INITIAL_THRESHOLD, INITIAL_WEIGHTS, ReadTrust
from .trunk import Trunk, TrunkBlock

# generate's default of 20 new tokens is 20 bytes: ship a length worth reading (SPEC §7)
DEFAULT_MAX_NEW_TOKENS = 200
REMOTE_CODE_AUTO_MAP = {
    "AutoConfig": "configuration_kathleen.KathleenConfig",
    "AutoModel": "modeling_kathleen.KathleenModel",
    "AutoModelForCausalLM": "modeling_kathleen.KathleenForCausalLM",
}


@dataclass
class KathleenModelOutput(ModelOutput):
    """last_hidden_state [B, T, D] (final-normed trunk output), memory_logits [B, T, V] or None (the last
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


@dataclass
class KathleenCausalLMOutput(ModelOutput):
    """logits = trunk_logits + memory_logits, each [B, T, V]; loss is the shifted cross-entropy; write_strengths
    β [B, T] of the notebook when asked for (`output_write_strengths=True`); hidden_states as KathleenModelOutput's
    (`output_hidden_states=True`)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    trunk_logits: torch.Tensor | None = None
    memory_logits: torch.Tensor | None = None
    cache: KathleenCache | None = None
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
            init.copy_(module.weights, torch.tensor(INITIAL_WEIGHTS))
            init.constant_(module.threshold, INITIAL_THRESHOLD)


def init_notebook(notebook: Notebook, config: KathleenConfig) -> None:
    """The notebook's initial read scale, forget logit and gate bias, and its fixed codebooks (SPEC §3)."""
    init.constant_(notebook.read_scale, config.effective_read_scale_init)
    init.constant_(notebook.forget_logit, config.forget_logit_init)
    if notebook.gate is not None:
        init.constant_(notebook.gate.out.bias, config.gate_bias_init)
    if config.uses_surprise:
        init.constant_(notebook.surprise_scale, config.surprise_scale_init)
        init.constant_(notebook.surprise_shift, config.surprise_shift_init)
    for name, table in make_codebooks(config).items():
        init.copy_(getattr(notebook, name), table)


def shifted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: logits at t predict labels at t+1; label -100 is ignored."""
    if labels.shape != input_ids.shape:
        raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(labels.shape)}")
    if logits.shape[1] != labels.shape[1]:
        raise ValueError("labels need logits at every position: leave logits_to_keep at 0")
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


def valid_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[B, T] bool: which input positions are real bytes, or None when all are (then no masking op runs,
    which shows in per-byte decoding). generate passes a mask over past + new positions, so its last T
    columns are the ones that count."""
    B, T = input_ids.shape
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape[0] != B or attention_mask.shape[1] < T:
        raise ValueError(f"attention_mask must have shape [{B}, >= {T}], got {tuple(attention_mask.shape)}")
    valid = attention_mask[:, -T:].bool()
    return None if bool(valid.all()) else valid


def first_position_read(length: int, logits_to_keep: int | torch.Tensor) -> int:
    """The first position whose logits are asked for: length - n for logits_to_keep = n > 0, else 0 (all, or
    the positions a tensor names)."""
    if isinstance(logits_to_keep, int) and 0 < logits_to_keep < length:
        return length - logits_to_keep
    return 0


def check_input_ids(input_ids: torch.Tensor | None, vocab_size: int) -> None:
    """Raise a `ValueError` that says what is wrong with input_ids (shape, dtype, range)."""
    if input_ids is None:
        raise ValueError("input_ids is required (inputs_embeds are not supported by a byte model)")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [batch, length], got {tuple(input_ids.shape)}")
    if input_ids.dtype.is_floating_point or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: the model needs at least one token per sequence")
    if input_ids.is_meta:  # shapes only (size and cost estimates): there are no values to check
        return
    low, high = (int(x) for x in torch.aminmax(input_ids))
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size}); bytes are ids 3..258")


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
        reference: bool = False,
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
        count); write_mask [B, T] replaces the notebook's β; reference=True runs the sequential oracles;
        logits_to_keep = n > 0 returns memory logits of the last n positions only (the notebook then reads
        only those: prefill and reading a document into memory need no logits before the end);
        return_dict=False returns the output's fields as a tuple (a ModelOutput costs time per decoded byte);
        None follows config.return_dict, as Transformers' models do (PEFT passes None).
        lm_head: the byte head, applied to every position (trunk_logits) when given; a notebook that writes by
        the trunk's surprise cannot run without it. output_write_strengths returns the notebook's β;
        output_hidden_states (default config.output_hidden_states) the embedding and every block's output."""
        if inputs_embeds is not None:
            raise ValueError("inputs_embeds are not supported: pass byte token ids as input_ids")
        check_input_ids(input_ids, self.config.vocab_size)
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        B, T = input_ids.shape
        if cache is not None:
            cache.check_compatible(self.fingerprint, B)
        valid = valid_positions(input_ids, attention_mask)
        ids = input_ids if valid is None else torch.where(valid, input_ids, PAD_ID)
        if write_mask is not None and write_mask.shape != input_ids.shape:
            raise ValueError(f"write_mask must have shape {tuple(input_ids.shape)}, got {tuple(write_mask.shape)}")

        past = cache if cache is not None and not cache.is_empty() else None
        wanted = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        all_hidden = [] if wanted else None
        hidden, trunk_states = self.trunk(ids, valid, None if past is None else past.trunk, reference=reference,
                                          hidden_states=all_hidden)
        trunk_logits = None if lm_head is None else lm_head(hidden)
        memory_logits, memory_state, write_strengths = None, None, None
        first_read = first_position_read(T, logits_to_keep)
        if isinstance(self.memory, Notebook):
            if self.config.uses_surprise and trunk_logits is None:
                raise ValueError("this model's notebook writes by the trunk's surprise and needs its byte head: use "
                                 "KathleenForCausalLM, or pass lm_head=")
            memory_logits, memory_state, write_strengths = self.memory(
                ids, valid, None if past is None else past.memory, write_mask=write_mask, reference=reference,
                first_read=first_read, trunk_logits=trunk_logits, output_write_strengths=True,
            )
        elif isinstance(self.memory, AttentionHead):
            memory_logits, memory_state = self.memory(hidden, valid, None if past is None else past.memory)
            memory_logits = memory_logits[:, first_read:]

        if use_cache:
            cache = cache if cache is not None else KathleenCache(self.config)
            cache.trunk, cache.memory = trunk_states, memory_state
            cache.seen_tokens += T
        all_hidden = None if all_hidden is None else tuple(all_hidden)
        fields = (hidden, memory_logits, cache if use_cache else None, trunk_logits,
                  write_strengths if output_write_strengths else None, all_hidden)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return KathleenModelOutput(*fields) if return_dict else fields


class KathleenForCausalLM(KathleenPreTrainedModel, GenerationMixin):
    """Kathleen trunk + memory + byte head, for `generate`, `pipeline` and training."""

    _tied_weights_keys: dict[str, str] = {}

    def __init__(self, config: KathleenConfig):
        super().__init__(config)
        self.model = KathleenModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        self.generation_config = GenerationConfig(
            max_new_tokens=DEFAULT_MAX_NEW_TOKENS, pad_token_id=config.pad_token_id,
            eos_token_id=config.eos_token_id, bos_token_id=config.bos_token_id,
        )

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs) -> None:
        """`generate` gets a fresh `KathleenCache` up front, so chunked prefill has a cache to fill."""
        if model_kwargs.get("cache") is None and generation_config.use_cache is not False:
            model_kwargs["cache"] = KathleenCache(self.config)
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.trunk.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.trunk.embed = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: KathleenCache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        write_mask: torch.Tensor | None = None,
        reference: bool = False,
        return_dict: bool | None = None,
        output_write_strengths: bool = False,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> KathleenCausalLMOutput | tuple:
        """As `KathleenModel.forward`, plus labels [B, T] (shifted inside; -100 is ignored) and
        logits_to_keep (0: all positions; n: the last n; a tensor: those positions)."""
        surprise = self.config.memory == "notebook" and self.config.uses_surprise  # the notebook needs every logit
        hidden, memory_logits, cache, all_trunk_logits, write_strengths, hidden_states = self.model(
            input_ids, attention_mask=attention_mask, cache=cache, use_cache=use_cache, write_mask=write_mask,
            reference=reference, logits_to_keep=logits_to_keep, return_dict=False,
            lm_head=self.lm_head if surprise else None, output_write_strengths=output_write_strengths,
            output_hidden_states=output_hidden_states, **kwargs)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        trunk_logits = self.lm_head(hidden[:, keep]) if all_trunk_logits is None else all_trunk_logits[:, keep]
        if memory_logits is not None:  # n kept: already n long
            memory_logits = memory_logits[:, keep]
            if isinstance(self.model.memory, Notebook):
                memory_logits = self.model.memory.trusted(memory_logits, trunk_logits)
        logits = trunk_logits if memory_logits is None else trunk_logits + memory_logits.to(trunk_logits.dtype)

        loss = None if labels is None else shifted_cross_entropy(logits, labels, input_ids)
        out = KathleenCausalLMOutput(loss=loss, logits=logits, trunk_logits=trunk_logits,
                                     memory_logits=memory_logits, cache=cache, write_strengths=write_strengths,
                                     hidden_states=hidden_states)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return out if return_dict else out.to_tuple()
