"""`KathleenCache`: the whole recurrent state of a Kathleen model as a Transformers `Cache` (`RecurrentCache` is
what it shares with `NotebookAdapterCache`, the notebook's state beside another model's cache, in
modeling_notebook_adapter.py).

It holds one `TrunkState` per block and the memory's state (`NotebookState`, or `AttentionState`
for the attention arm). For the trunk and the notebook its size does not grow with length. Beam
reordering and batch repeat/select are one tree-map over every tensor. `save` / `load` keep it on disk
as safetensors with a format version and a fingerprint of the model config.

A recurrent state cannot drop its last bytes the way a key/value cache drops its last rows. Assisted and
prompt-lookup decoding need that (they verify a draft, then go back to the last byte they accept), so a
`RecurrentCache` that `activate_past_recording` switched on keeps copies of its state at the last few positions
(the model reads those bytes one at a time: `ByteCausalLM.forward_recording`), and `crop` goes back to one (an
adapter's cache crops its base model's cache too).
Once a crop came, the cache is in Transformers' draft-and-verify loop, where each round ends in a crop that may go
back over every byte read since the last: a draft can grow past the number it was activated with (the "heuristic"
schedule adds two bytes after each draft it accepts whole), so from then on every such byte is kept.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers.cache_utils import Cache

from .atomic import write_atomically
from .attention import AttentionState
from .configuration_kathleen import KathleenConfig
from .notebook import NotebookState
from .trunk import TrunkState

CACHE_FORMAT_VERSION = 2
# version 1 called the notebook's memory spectrum "memory" (NotebookState.spectrum now): read, then renamed
RENAMED_IN_VERSION_2 = {"memory.memory": "memory.spectrum", "notebook.memory": "notebook.spectrum"}
# config fields newer than the fingerprint
LATER_FIELDS = {"key_binding": "bundle", "write_signal": "gate", "attention_keys": "current", "fact_bank": False,
                "repeat_key_window": 0}
MemoryState = NotebookState | AttentionState | None
MEMORY_STATE_CLASSES = {"notebook": NotebookState, "attention": AttentionState, "none": None}


def config_fingerprint(config: KathleenConfig) -> str:
    """A short hash of every config field that changes the meaning of a state."""
    fields = ("vocab_size", "d_model", "n_layers", "decay_bands", "conv_kernel", "memory", "hrr_dim", "key_window",
              "gate_window", "value_codebook", "fft_norm", "forgetting", "key_seed", "effective_attention_dim")
    described = {name: getattr(config, name) for name in fields}
    # settings added later count only where they differ from their default: older fingerprints stay valid
    described |= {name: getattr(config, name) for name, default in LATER_FIELDS.items()
                  if getattr(config, name) != default}
    described = json.dumps(described, sort_keys=True)
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def map_state(state, fn: Callable[[torch.Tensor], torch.Tensor]):
    """Apply fn to every tensor of a state dataclass (batch is dim 0 everywhere)."""
    if state is None:
        return None
    return dataclasses.replace(state, **{f.name: fn(getattr(state, f.name)) for f in dataclasses.fields(state)})


def mapped(trunk: list[TrunkState] | None, memory: MemoryState,
           fn: Callable[[torch.Tensor], torch.Tensor]) -> tuple[list[TrunkState] | None, MemoryState]:
    """A Kathleen state (trunk states, memory state) with fn applied to every tensor."""
    return None if trunk is None else [map_state(s, fn) for s in trunk], map_state(memory, fn)


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str]) -> None:
    """A safetensors file written atomically (atomic.py): a crash leaves the old file."""
    write_atomically(path, lambda staged: save_file(tensors, staged, metadata=metadata))


class RecurrentCache(Cache):
    """What `generate` asks of a cache whose state does not grow: a position count, beam reordering and
    batch repeat/select (through `_map`), and going back over the last bytes read by keeping copies of the state
    (`activate_past_recording`, `crop`). Subclasses hold the tensors and say what a copy is (`kept_state`,
    `restore`)."""

    is_compileable = False  # a compileable cache makes `generate` drop the 2-D padding mask (SPEC §7)

    def __init__(self, seen_tokens: int = 0):
        super().__init__(layers=[])
        self.seen_tokens = seen_tokens
        self.record_past = False  # activate_past_recording switches it on
        self.positions_to_keep: int | None = None
        self.drafting = False  # a crop came since recording began: keep every byte read since the last crop
        self.recorded: dict[int, object] = {}  # position -> `kept_state()` there

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    # generate feeds only the unseen part of input_ids when a cache is passed back in, but only if some
    # layer reports "not linear"; ours counts positions exactly, so it reports one such layer.
    @property
    def is_linear(self) -> list[bool]:
        return [False]

    @property
    def is_sliding(self) -> list[bool]:
        return [False]

    @property
    def is_dummy(self) -> list[bool]:
        return [False]

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply fn to every state tensor, the kept copies' too (batch is dim 0 everywhere)."""
        raise NotImplementedError

    @property
    def batch_size(self) -> int | None:
        """How many sequences the state holds (None while empty)."""
        raise NotImplementedError

    def check_batch_size(self, batch_size: int) -> None:
        """Raise a `ValueError` when the state holds another number of sequences than the input has."""
        if self.batch_size is not None and self.batch_size != batch_size:
            raise ValueError(f"the cache holds {self.batch_size} sequences but the input has {batch_size}")

    def inner_caches(self) -> list[Cache]:
        """Caches of other models kept inside this one (the adapter's base model): beam and batch
        operations reach them too."""
        return []

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))
        for inner in self.inner_caches():
            inner.reorder_cache(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))
        for inner in self.inner_caches():
            inner.batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])
        for inner in self.inner_caches():
            inner.batch_select_indices(indices)

    def reset(self) -> None:
        """Forget everything read, and stop recording: the cache is as a model's `new_cache()` makes it.
        Subclasses clear their state, then call this."""
        self.seen_tokens, self.recorded = 0, {}
        self.record_past, self.positions_to_keep, self.drafting = False, None, False

    # ---- going back: assisted and prompt-lookup decoding ----------------------------------------

    def kept_state(self) -> object:
        """A copy of the state at the current position, for `restore`."""
        raise NotImplementedError

    def restore(self, state: object, tokens_to_remove: int) -> None:
        """Go back to a state `kept_state` made, `-tokens_to_remove` bytes ago."""
        raise NotImplementedError

    @property
    def is_croppable(self) -> bool:
        return True

    def activate_past_recording(self, recurrent_states_to_keep: int | None = None, **kwargs) -> None:
        """From now on keep the state at each of the last `recurrent_states_to_keep` positions (None: at every
        position of every forward), so that `crop` can go back over that many bytes. Transformers calls this before
        assisted or prompt-lookup decoding, with the most draft bytes it will verify at once."""
        self.record_past, self.positions_to_keep, self.drafting = True, recurrent_states_to_keep, False

    def bytes_to_record(self, length: int) -> int:
        """How many of a forward's last `length` bytes a crop may go back over: all of them in the draft-and-verify
        loop (a round's bytes come in small forwards; a long prompt read before the first crop does not), else the
        last `positions_to_keep`."""
        return length if self.drafting or self.positions_to_keep is None else min(length, self.positions_to_keep)

    def record(self) -> None:
        """Keep a copy of the state at the current position (the model calls this before each byte it may be cropped
        back over), and, before the first crop, forget those more than `positions_to_keep` bytes back once that byte
        is read (from the first crop on, each crop lets go of what was kept)."""
        self.recorded[self.seen_tokens] = self.kept_state()
        if self.positions_to_keep is not None and not self.drafting:
            oldest = self.seen_tokens + 1 - self.positions_to_keep
            self.recorded = {position: state for position, state in self.recorded.items() if position >= oldest}

    def crop(self, tokens_to_remove: int) -> None:
        """Go back `-tokens_to_remove` bytes (a number at most 0, as Transformers' caches take it) to a state the
        recording kept; 0 changes nothing. The kept states are then let go."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes minus the number of bytes to drop, not {tokens_to_remove}")
        target = self.seen_tokens + tokens_to_remove
        if target < self.seen_tokens:
            if target not in self.recorded:
                kept = sorted(self.recorded) or "none"
                raise ValueError(
                    f"cannot go back to position {target}: a recurrent state can only return to a position it kept "
                    f"(kept: {kept}); call activate_past_recording(n) before the forward that reads the bytes to drop")
            self.restore(self.recorded[target], tokens_to_remove)
            self.seen_tokens = target
        self.recorded, self.drafting = {}, self.record_past


class KathleenCache(RecurrentCache):
    """Recurrent state of `KathleenForCausalLM`; `get_seq_length()` is the number of positions read."""

    def __init__(
        self,
        config: KathleenConfig,
        trunk: list[TrunkState] | None = None,
        memory: MemoryState = None,
        seen_tokens: int = 0,
    ):
        super().__init__(seen_tokens)
        self.fingerprint = config_fingerprint(config)
        self.memory_kind = config.memory
        self.trunk = trunk
        self.memory = memory
        self.key_memo = None  # not state: the compiled step's last read keys (decode_step.key_memo)

    def __getstate__(self) -> dict:
        """A copy or a pickle goes without the key memo: derived, and formed again at its first compiled byte."""
        return {**self.__dict__, "key_memo": None}

    def is_empty(self) -> bool:
        return self.trunk is None

    @property
    def batch_size(self) -> int | None:
        return None if self.trunk is None else self.trunk[0].integrator.shape[0]

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.trunk, self.memory = mapped(self.trunk, self.memory, fn)
        self.recorded = {position: mapped(*state, fn) for position, state in self.recorded.items()}

    def reset(self) -> None:
        self.trunk, self.memory = None, None
        super().reset()

    def kept_state(self) -> tuple[list[TrunkState] | None, MemoryState]:
        return mapped(self.trunk, self.memory, torch.clone)

    def restore(self, state: tuple[list[TrunkState] | None, MemoryState], tokens_to_remove: int) -> None:
        self.trunk, self.memory = state

    def check_fingerprint(self, fingerprint: str) -> None:
        """Raise a `ValueError` if this cache was built for a model of another config."""
        if self.fingerprint != fingerprint:
            raise ValueError(
                f"this KathleenCache belongs to a model with config fingerprint {self.fingerprint}, "
                f"not {fingerprint}: states of different models cannot be mixed"
            )

    # ---- on disk -----------------------------------------------------------------------------

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Flat name -> tensor map of the state (complex spectra stay complex)."""
        tensors = {}
        for i, block in enumerate(self.trunk or []):
            for f in dataclasses.fields(block):
                tensors[f"trunk.{i}.{f.name}"] = getattr(block, f.name)
        if self.memory is not None:
            for f in dataclasses.fields(self.memory):
                tensors[f"memory.{f.name}"] = getattr(self.memory, f.name)
        return {name: t.detach().contiguous().cpu() for name, t in tensors.items()}

    def to_safetensors(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Tensors and metadata of a cache file: complex spectra as [..., 2] real views."""
        if self.trunk is None:
            raise ValueError("the cache is empty: read some text before saving it")
        tensors = self.state_tensors()
        complex_names = sorted(name for name, t in tensors.items() if t.is_complex())
        tensors = {name: torch.view_as_real(t) if t.is_complex() else t for name, t in tensors.items()}
        metadata = {
            "format": "kathleen-cache",
            "format_version": str(CACHE_FORMAT_VERSION),
            "config_fingerprint": self.fingerprint,
            "complex": json.dumps(complex_names),
            "memory_kind": self.memory_kind,
            "seen_tokens": str(self.seen_tokens),
        }
        return tensors, metadata

    @classmethod
    def from_safetensors(
        cls, tensors: dict[str, torch.Tensor], metadata: dict[str, str], config: KathleenConfig, source: str
    ) -> KathleenCache:
        """Rebuild a cache from `to_safetensors` output; a foreign or incomplete one raises `ValueError`."""
        tensors = current_names(tensors, metadata, source)
        cache = cls(config, seen_tokens=int(metadata.get("seen_tokens", 0)))
        if metadata.get("config_fingerprint") != cache.fingerprint:
            raise ValueError(
                f"{source} was saved by a model with config fingerprint {metadata.get('config_fingerprint')}, "
                f"but this model's is {cache.fingerprint}"
            )
        for name in json.loads(metadata.get("complex", "[]")):
            name = RENAMED_IN_VERSION_2.get(name, name)
            if name in tensors:
                tensors[name] = torch.view_as_complex(tensors[name].contiguous())
        try:
            cache.trunk = [
                TrunkState(**{f.name: tensors[f"trunk.{i}.{f.name}"] for f in dataclasses.fields(TrunkState)})
                for i in range(config.n_layers)
            ]
            state_class = MEMORY_STATE_CLASSES[config.memory]
            if state_class is NotebookState and "memory.last_logits" not in tensors:  # written before surprise writes
                batch = tensors["memory.spectrum"].shape[0]
                tensors["memory.last_logits"] = torch.zeros(batch, config.vocab_size if config.uses_surprise else 0)
            banks = {"fact_spectrum": config.fact_bank, "repeat_spectrum": config.repeat_key_window}
            if state_class is NotebookState:  # written before fact or repeat banks: such a bank's empty spectrum
                for bank, present in banks.items():
                    if f"memory.{bank}" not in tensors and not present:
                        tensors[f"memory.{bank}"] = tensors["memory.spectrum"][:, :0]
            if state_class is AttentionState and "memory.pending_key" not in tensors:  # before attention_keys
                tensors["memory.pending_key"] = torch.zeros(tensors["memory.keys"].shape[0], 0)
            if state_class is not None:
                fields = {f.name: tensors[f"memory.{f.name}"] for f in dataclasses.fields(state_class)}
                cache.memory = state_class(**fields)
        except KeyError as missing:
            raise ValueError(f"{source} lacks the state tensor {missing}") from None
        return cache

    def save(self, path: str | os.PathLike) -> None:
        """Write the state to `path` (safetensors, atomic) with format version and config fingerprint."""
        tensors, metadata = self.to_safetensors()
        save_safetensors(tensors, path, metadata)

    @classmethod
    def load(cls, path: str | os.PathLike, config: KathleenConfig, device: torch.device | str = "cpu") -> KathleenCache:
        """Read a cache written by `save`; a foreign, truncated or corrupted file raises `ValueError`."""
        tensors, metadata = read_safetensors(path, "kathleen-cache", device)
        return cls.from_safetensors(tensors, metadata, config, str(path))


def current_names(tensors: dict[str, torch.Tensor], metadata: dict[str, str], source: str) -> dict[str, torch.Tensor]:
    """The tensors of a cache file under this version's names; a version this code does not know raises
    `ValueError`."""
    version = metadata.get("format_version")
    if version not in ("1", str(CACHE_FORMAT_VERSION)):
        raise ValueError(f"{source} has cache format version {version!r}; this code reads versions 1 to "
                         f"{CACHE_FORMAT_VERSION}")
    if version == "1":
        return {RENAMED_IN_VERSION_2.get(name, name): tensor for name, tensor in tensors.items()}
    return dict(tensors)


def read_safetensors(
    path: str | os.PathLike, expected_format: str, device: torch.device | str = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of one of our safetensors files; anything unreadable raises `ValueError`."""
    from safetensors import safe_open

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as error:
        message = f"{path} is not a readable {expected_format} file (truncated or corrupted?): {error}"
        raise ValueError(message) from None
    if metadata.get("format") != expected_format:
        raise ValueError(f"{path} is a {metadata.get('format')!r} file, not a {expected_format} file")
    return tensors, metadata
