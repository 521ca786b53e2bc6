"""The causal-LM head both model classes share: `KathleenForCausalLM` (the Kathleen trunk + memory) and
`NotebookAdapterForCausalLM` (any Transformers causal LM + the notebook).

    input_ids ─ checks ─> ids (padding set to the pad id), valid, the first position read
    trunk_logits[kept] + trust(memory_logits[kept]) = logits ─> shifted cross-entropy ─> KathleenCausalLMOutput

and, for `generate`, the generation defaults and a fresh recurrent cache before the prompt is read.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig
from transformers.utils import ModelOutput, logging

from .cache import RecurrentCache
from .configuration_kathleen import PAD_ID

# generate's default of 20 new tokens is 20 bytes: ship a length worth reading (SPEC §7)
DEFAULT_MAX_NEW_TOKENS = 200

logger = logging.get_logger(__name__)


def fixed_vocabulary(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                     mean_resizing: bool = True) -> nn.Embedding:
    """`resize_token_embeddings` of a byte model: its ids are the 256 bytes and 3 specials, and the notebook's
    tables have a row per id, so the size stays. Asked for the size it has (or None), it returns the input
    embeddings as Transformers' does; any other size is refused before anything changes."""
    embeddings = self.get_input_embeddings()
    size = embeddings.num_embeddings if new_num_tokens is None else new_num_tokens
    if pad_to_multiple_of:
        size = -(-size // pad_to_multiple_of) * pad_to_multiple_of
    if size != embeddings.num_embeddings:
        raise ValueError(f"{type(self).__name__} reads bytes: its vocabulary is fixed at {embeddings.num_embeddings} "
                         f"ids (256 bytes and pad, eos, unk), and the notebook's tables have a row per id, so it "
                         f"cannot be resized to {size}. Bytes need no new tokens: any text is already encoded.")
    return embeddings


@dataclass
class KathleenCausalLMOutput(ModelOutput):
    """logits = trunk_logits + memory_logits, each [B, T, V]; loss is the shifted cross-entropy; write_strengths
    β [B, T] of the notebook when asked for (`output_write_strengths=True`); hidden_states as KathleenModelOutput's
    (`output_hidden_states=True`)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    trunk_logits: torch.Tensor | None = None
    memory_logits: torch.Tensor | None = None
    cache: RecurrentCache | None = None
    write_strengths: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None

    # ModelOutput's own __setattr__ calls `dataclasses.fields` at every assignment and __post_init__ checks the class
    # again, a visible share of a compiled decoding step. The same behaviour with the field names looked up once:
    def __setattr__(self, name, value):
        name = self._replace_old_cache_name(name)
        if value is not None and name in OUTPUT_FIELDS:
            OrderedDict.__setitem__(self, name, value)
        object.__setattr__(self, name, value)

    def __post_init__(self):
        """__setattr__ has filled the dict in field order. A dict or pairs passed as the first field (accelerate
        rebuilds outputs so under mixed precision) take ModelOutput's own unpacking; its class checks are skipped."""
        if self.loss is not None and not isinstance(self.loss, torch.Tensor):
            super().__post_init__()


OUTPUT_FIELDS = frozenset(field.name for field in fields(KathleenCausalLMOutput))


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


def kept_positions(logits_to_keep: int | torch.Tensor) -> slice | torch.Tensor:
    """The index of the positions whose logits are returned: all (0), the last n (n), or those a tensor names."""
    return slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep


def shifted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: logits at t predict labels at t+1; label -100 is ignored."""
    if labels.shape != input_ids.shape:
        raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(labels.shape)}")
    if logits.shape[1] != labels.shape[1]:
        raise ValueError("labels need logits at every position: leave logits_to_keep at 0")
    if not labels.is_meta:  # meta: shapes only, no values to check
        outside = (labels != -100) & ((labels < 0) | (labels >= logits.shape[-1]))
        if outside.any():
            raise ValueError(f"labels must be token ids in [0, {logits.shape[-1]}) or -100 (ignored), got "
                             f"{int(labels[outside][0])}")
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


@dataclass
class ByteInputs:
    """Checked model inputs: ids [B, T] with padding set to the pad id, valid [B, T] (None: no padding), and
    the first position whose logits are asked for."""

    ids: torch.Tensor
    valid: torch.Tensor | None
    first_read: int


def byte_inputs(
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    vocab_size: int,
    logits_to_keep: int | torch.Tensor = 0,
    write_mask: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    cache: RecurrentCache | None = None,
) -> ByteInputs:
    """Check what a forward was given (a `ValueError` that says what is wrong) and prepare it."""
    if inputs_embeds is not None:
        raise ValueError("inputs_embeds are not supported: pass byte token ids as input_ids")
    check_input_ids(input_ids, vocab_size)
    if write_mask is not None and write_mask.shape != input_ids.shape:
        raise ValueError(f"write_mask must have shape {tuple(input_ids.shape)}, got {tuple(write_mask.shape)}")
    if cache is not None:
        cache.check_batch_size(input_ids.shape[0])
    valid = valid_positions(input_ids, attention_mask)
    ids = input_ids if valid is None else torch.where(valid, input_ids, PAD_ID)
    return ByteInputs(ids, valid, first_position_read(input_ids.shape[1], logits_to_keep))


class ByteCausalLM:
    """What a byte causal LM with a recurrent memory cache does on top of its trunk: generation defaults, a fresh
    cache for `generate`, and logits = trunk + memory with loss and output (`causal_lm_output`). Listed before
    `GenerationMixin` among a model's bases (Transformers looks for that one among the direct bases)."""

    def new_cache(self) -> RecurrentCache:
        """An empty cache of this model's kind."""
        raise NotImplementedError

    def default_generation_config(self) -> GenerationConfig:
        config = self.config
        return GenerationConfig(max_new_tokens=DEFAULT_MAX_NEW_TOKENS, pad_token_id=config.pad_token_id,
                                eos_token_id=config.eos_token_id, bos_token_id=config.bos_token_id)

    def _prepare_generation_config(self, generation_config: GenerationConfig | None, **kwargs) -> tuple:
        """The default length is in new bytes (`max_new_tokens`); a caller's own `max_length`, as an argument or in a
        generation config, without a `max_new_tokens` of its own, is the total length they get (Transformers would
        let the default's max_new_tokens win over it)."""
        asked = generation_config or GenerationConfig()
        own_length = kwargs.get("max_length", asked.max_length) is not None
        own_new_tokens = kwargs.get("max_new_tokens", asked.max_new_tokens) is not None
        generation_config, model_kwargs = super()._prepare_generation_config(generation_config, **kwargs)
        if own_length and not own_new_tokens:
            generation_config.max_new_tokens = None
        return generation_config, model_kwargs

    def _prepare_model_inputs(self, inputs: torch.Tensor | None, bos_token_id, model_kwargs: dict) -> tuple:
        """GenerationMixin's, then the ids checked as `forward` checks them: a 1-D tensor would otherwise stop inside
        generate's mask building with an IndexError that names nothing."""
        inputs, input_name, model_kwargs = super()._prepare_model_inputs(inputs, bos_token_id, model_kwargs)
        if input_name == "input_ids":
            check_input_ids(inputs, self.config.vocab_size)
        return inputs, input_name, model_kwargs

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs) -> None:
        """`generate` gets a fresh cache up front, so chunked prefill has a cache to fill. Transformers' cache choices
        (`cache_implementation`) are for attention's growing caches: as Transformers' own recurrent models do, one
        asked for is ignored with a warning (Transformers would complain of a cache the caller never passed). An
        assistant model's new cache records its past, as Transformers does for the caches it makes: the candidate
        generator crops it after each round."""
        if generation_config.cache_implementation is not None:
            logger.warning_once(
                f"{type(self).__name__} keeps its whole state in a {type(self.new_cache()).__name__}, a recurrent "
                f"state of fixed size: cache_implementation={generation_config.cache_implementation!r} does not "
                "apply to it and is ignored")
            generation_config.cache_implementation = None  # generate's own copy of the config
        if model_kwargs.get("cache") is None and generation_config.use_cache is not False:
            model_kwargs["cache"] = self.new_cache()
            if generation_config.is_assistant and model_kwargs["cache"].is_croppable:
                model_kwargs["cache"].activate_past_recording(generation_config.num_assistant_tokens)
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    @staticmethod
    def records(cache: RecurrentCache | None, use_cache: bool | None) -> bool:
        """Whether a forward goes to a cache that records its past: a plain call (ids in; logits and the cache out)
        then reads through `forward_recording`, and any other ends what the cache kept (crop cannot go back over it).
        Only then are the call's arguments looked at, so a decoding step pays one check."""
        return isinstance(cache, RecurrentCache) and cache.record_past and use_cache is not False

    def forward_recording(
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, cache: RecurrentCache,
        logits_to_keep: int | torch.Tensor, return_dict: bool | None, **kwargs,
    ) -> KathleenCausalLMOutput | tuple:
        """`forward` for a cache that records its past (assisted and prompt-lookup decoding, cache.py): the last
        bytes a `crop` may go back over (`cache.bytes_to_record`) are read one at a time with the state kept before
        each; the bytes before them in one call. Same logits as one call (incremental decoding equals the full
        forward); only the logits and the cache are returned."""
        length = input_ids.shape[1]
        one_by_one = cache.bytes_to_record(length)
        start = length - one_by_one
        past_columns = 0 if attention_mask is None else attention_mask.shape[1] - length  # the mask covers past + new

        def read(first: int, end: int, keep: int) -> KathleenCausalLMOutput:
            mask = None if attention_mask is None else attention_mask[:, :past_columns + end]
            positions = kwargs.get("position_ids")  # an adapter's base model may be given these: one per byte
            sliced = {} if positions is None else {"position_ids": positions[..., first:end]}
            return self(input_ids[:, first:end], attention_mask=mask, cache=cache, logits_to_keep=keep,
                        return_dict=True, **{**kwargs, **sliced})

        some = isinstance(logits_to_keep, int) and logits_to_keep > 0  # the last n positions, else all (then indexed)
        outputs = []
        cache.record_past = False  # the parts below are plain forwards
        try:
            if start:
                wanted = logits_to_keep - one_by_one if some else 0  # of the head's positions (0: all)
                head = read(0, start, max(wanted, 1) if some else 0)  # a forward returns at least one position
                if not some or wanted > 0:
                    outputs.append(head)
            for position in range(start, length):
                cache.record()
                outputs.append(read(position, position + 1, 1))
        finally:
            cache.record_past = True
        fields = {}
        for name in ("logits", "trunk_logits", "memory_logits"):
            parts = [getattr(out, name) for out in outputs]
            if all(part is not None for part in parts):
                joined = torch.cat(parts, dim=1)
                fields[name] = joined[:, kept_positions(logits_to_keep)]
        out = KathleenCausalLMOutput(**fields, cache=cache)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return out if return_dict else out.to_tuple()

    def causal_lm_output(
        self,
        input_ids: torch.Tensor,
        trunk_logits: torch.Tensor,
        memory_logits: torch.Tensor | None,
        notebook: torch.nn.Module | None,
        labels: torch.Tensor | None,
        return_dict: bool | None,
        logits: torch.Tensor | None = None,
        **fields,
    ) -> KathleenCausalLMOutput | tuple:
        """trunk_logits and memory_logits [B, n, V] of the kept positions -> logits = trunk + memory (the memory's
        through the notebook's read trust, when `notebook` is one; `logits`: that sum, made already), the loss of
        `labels`, and the output (a tuple when return_dict is False; None follows config.return_dict, as PEFT
        expects)."""
        if memory_logits is not None and notebook is not None:
            memory_logits = notebook.trusted(memory_logits, trunk_logits)
        if logits is None:
            logits = trunk_logits if memory_logits is None else trunk_logits + memory_logits.to(trunk_logits.dtype)
        loss = None if labels is None else shifted_cross_entropy(logits, labels, input_ids)
        out = KathleenCausalLMOutput(loss=loss, logits=logits, trunk_logits=trunk_logits,
                                     memory_logits=memory_logits, **fields)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return out if return_dict else out.to_tuple()
