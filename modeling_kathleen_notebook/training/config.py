"""A training config: JSON in, typed and checked dataclasses out, every problem raised before training starts.

    {"model": {...KathleenConfig fields, or {"base_config": {...}, "notebook_config": {...}}: the adapter},
     "data": {"train": DataSpec, "eval": DataSpec},
     "train": TrainSettings,
     "output_dir": "runs/..."}

A data spec reads files ({"files": [...], "format": "text" | "json", "column": "text", "byte_range": [start, end]}),
a `datasets` dataset ({"dataset": id, "name": ..., "split": ..., "column": ...}), makes needle haystacks
({"needle": {"n_needles": 1, "n_queries": 1, "loss": "all" | "answers", "marker": true, "filler_file": null}}) or
MQAR sequences ({"mqar": {"n_pairs": 8, "n_reassigned": 0, "value_length": 2, "loss": "answers" | "all",
"key_length": 6}});
"facts": {"probability": 0.5, "max_facts": 4}
mixes fact documents into a corpus (experiments/facts.py's training part; with train.stream_windows > 1 a fact
document spans a whole stream).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from ..configuration_kathleen import KathleenConfig
from ..configuration_notebook_adapter import NotebookAdapterConfig
from ..experiments.mqar import distinct_keys
from ..experiments.needle import KEY_LENGTH


@dataclass
class TrainSettings:
    """The recipe: AdamW with warm-up and a cosine down to min_lr_ratio · lr."""

    seed: int = 42
    lr: float = 2e-3  # SPEC §5: 3e-3 for needles, 2e-3 for text
    weight_decay: float = 0.01
    clip: float = 1.0
    batch_size: int = 32
    min_length: int = 128  # each step's window length is uniform in [min_length, max_length]
    max_length: int = 512
    # > 0: a sequence-length curriculum: the largest length a step may draw rises linearly from min_length to
    # max_length over this many steps (short, easy sequences first: how attention is taught MQAR on a budget)
    length_warmup_steps: int = 0
    steps: int = 1000
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # the cosine decays to this fraction of lr
    max_minutes: float | None = None  # stop early (and save) after this much wall time
    time_schedule: bool = False  # the cosine runs over max_minutes of wall time instead of `steps` (equal-time budgets)
    eval_every: int = 100
    eval_windows: int = 64
    eval_length: int = 512
    save_every: int = 200
    log_every: int = 10
    threads: int = 1
    oracle_gate: bool = False  # needle or MQAR data only: the example's oracle mask replaces the notebook's β
    write_penalty: float = 0.0  # a write budget: adds write_penalty · mean β to the loss
    # > 1: each batch row reads a stream of this many consecutive windows, the model's state carried (detached)
    # from one step to the next, so a fact can be asked many windows after it was read (text data only)
    stream_windows: int = 1
    # a saved model folder (save_pretrained) whose weights start the run, with a fresh optimizer and schedule: a run
    # continued under a new recipe is a new run; its model section must describe the same model
    init_from: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"train.min_length/max_length must satisfy 1 <= min <= max, got {self.min_length} and "
                             f"{self.max_length}")
        for name in ("batch_size", "eval_every", "eval_windows", "eval_length", "save_every", "log_every", "threads",
                     "stream_windows"):  # counts and periods: 0 would divide by zero mid-run
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("steps", "warmup_steps", "length_warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"train.max_minutes must be positive (or null: no limit), got {self.max_minutes}")
        if self.time_schedule and not self.max_minutes:
            raise ValueError("train.time_schedule needs train.max_minutes (the wall time the schedule runs over)")
        if self.stream_windows > 1 and self.save_every % self.stream_windows:
            raise ValueError(f"train.save_every ({self.save_every}) must be a multiple of train.stream_windows "
                             f"({self.stream_windows}) so that checkpoints fall between streams")


@dataclass
class NeedleSpec:
    n_needles: int = 1
    n_queries: int = 1  # needles asked at the end of a training haystack (the last one is scored in evaluation)
    loss: str = "all"  # "all": every next byte; "answers": only the queried values (MQAR's training signal)
    marker: bool = True
    filler_file: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.n_queries <= self.n_needles:
            raise ValueError(f"needle.n_queries must be between 1 and needle.n_needles ({self.n_needles}), got "
                             f"{self.n_queries}")
        if self.loss not in ("all", "answers"):
            raise ValueError(f"needle.loss must be \"all\" or \"answers\", got {self.loss!r}")


@dataclass
class MQARSpec:
    """Multi-query associative recall (experiments/mqar.py): n_pairs key-value pairs (with max_pairs, a number drawn
    per sequence from n_pairs..max_pairs, at most what the sequence holds), n_reassigned of them written again later
    with new values, every key asked once at the end."""

    n_pairs: int = 8
    max_pairs: int | None = None
    n_reassigned: int = 0
    value_length: int = 2
    loss: str = "answers"  # "answers": only the asked values (Zoology's training signal); "all": every next byte
    key_length: int = KEY_LENGTH  # letters after the marker; 1 is Zoology's one-token key

    def __post_init__(self) -> None:
        if self.n_pairs < 1 or not 0 <= self.n_reassigned <= self.n_pairs or self.value_length < 1:
            raise ValueError(f"mqar needs n_pairs >= 1, 0 <= n_reassigned <= n_pairs and value_length >= 1, got "
                             f"{self.n_pairs}, {self.n_reassigned} and {self.value_length}")
        if self.key_length < 1 or self.n_pairs > distinct_keys(self.key_length):
            raise ValueError(f"mqar.key_length must be >= 1 and leave n_pairs ({self.n_pairs}) distinct keys of "
                             f"lowercase letters, got {self.key_length}")
        if self.max_pairs is not None and self.max_pairs < self.n_pairs:
            raise ValueError(f"mqar.max_pairs ({self.max_pairs}) must be at least n_pairs ({self.n_pairs})")
        if self.loss not in ("all", "answers"):
            raise ValueError(f"mqar.loss must be \"all\" or \"answers\", got {self.loss!r}")


@dataclass
class FactMixing:
    probability: float = 0.5
    max_facts: int = 4


@dataclass
class DataSpec:
    """Where a split's bytes come from: files, a `datasets` dataset, needle haystacks or MQAR sequences."""

    files: list[str] | None = None
    format: str = "text"
    column: str = "text"
    byte_range: list[int | None] | None = None  # [start, end) of the concatenated documents' bytes
    dataset: str | None = None
    name: str | None = None
    split: str = "train"
    needle: NeedleSpec | None = None
    mqar: MQARSpec | None = None
    facts: FactMixing | None = None

    def __post_init__(self) -> None:
        if self.needle is not None and self.mqar is not None:
            raise ValueError("a data spec makes needle haystacks or MQAR sequences, not both")
        if self.task is None and self.files is None and self.dataset is None:
            raise ValueError("a data spec needs files, a dataset, or needle or mqar settings")

    @property
    def task(self) -> NeedleSpec | MQARSpec | None:
        """The synthetic task this split is made of, if any."""
        return self.needle if self.needle is not None else self.mqar


@dataclass
class TrainingConfig:
    model: dict
    train_data: DataSpec
    eval_data: DataSpec
    output_dir: str
    train: TrainSettings = field(default_factory=TrainSettings)

    def model_config(self) -> KathleenConfig | NotebookAdapterConfig:
        """The notebook adapter when the model section names a base_config, the Kathleen model otherwise."""
        return model_config(self.model)

    def to_dict(self) -> dict:
        """The JSON form `from_dict` reads (written next to a run)."""
        return {"model": self.model, "data": {"train": without_nones(self.train_data),
                                              "eval": without_nones(self.eval_data)},
                "train": dataclasses.asdict(self.train), "output_dir": self.output_dir}

    @classmethod
    def from_dict(cls, config: dict, source: str = "the training config") -> TrainingConfig:
        """Check and type a config dict: unknown sections and keys, wrong types and missing parts raise."""
        config = {k: v for k, v in config.items() if k != "_comment"}
        unknown = set(config) - {"model", "data", "train", "output_dir"}
        if unknown:
            raise ValueError(f"unknown section(s) {sorted(unknown)} in {source}; expected data, model, output_dir, "
                             f"train")
        if "data" not in config and "output_dir" not in config:
            raise ValueError(f"{source} is not a training config: it has no data section and no output_dir (a model "
                             f"preset such as configuration/presets/needle-*.json gives only the model)")
        if "output_dir" not in config:
            raise ValueError(f"{source} needs an output_dir")
        data = config.get("data", {})
        for split in ("train", "eval"):
            if split not in data:
                raise ValueError(f"{source} needs data.{split}")
        model = config.get("model", {})
        known = set(inspect.signature(type(model_config(model)).__init__).parameters) - {"self", "kwargs"}
        if set(model) - known:  # (model_config raised above on a bad value)
            raise ValueError(f"unknown model key(s) {sorted(set(model) - known)} in {source}; known: {sorted(known)}")
        typed = cls(model, typed_from_dict(DataSpec, data["train"], "data.train"),
                    typed_from_dict(DataSpec, data["eval"], "data.eval"), str(config["output_dir"]),
                    typed_from_dict(TrainSettings, config.get("train", {}), "train"))
        for split, spec in (("train", typed.train_data), ("eval", typed.eval_data)):
            for file in [*(spec.files or []), *filter(None, [spec.needle and spec.needle.filler_file])]:
                if not Path(file).is_file():
                    raise FileNotFoundError(f"data.{split} file {file} does not exist (paths are relative to the "
                                            f"working directory {os.getcwd()})")
        start = typed.train.init_from and Path(typed.train.init_from)
        if start and not ((start / "config.json").is_file() and any(start.glob("*.safetensors"))):
            raise FileNotFoundError(f"train.init_from {start} is not a saved model folder (it needs config.json and "
                                    f"safetensors weights; paths are relative to the working directory {os.getcwd()})")
        return typed


def model_config(section: dict) -> KathleenConfig | NotebookAdapterConfig:
    """The config a training config's model section describes: the notebook adapter when it names a base_config,
    the Kathleen model otherwise."""
    return NotebookAdapterConfig(**section) if "base_config" in section else KathleenConfig(**section)


def without_nones(spec) -> dict:
    return {k: v for k, v in dataclasses.asdict(spec).items() if v is not None}


def typed_from_dict(cls, values: dict, where: str):
    """An instance of the dataclass `cls` from a dict: unknown keys and values of the wrong type raise a `ValueError`
    that names them (`where`.key); nested dataclasses are read the same way."""
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be an object, got {values!r}")
    hints = typing.get_type_hints(cls)
    unknown = set(values) - set(hints)
    if unknown:
        raise ValueError(f"unknown {where} key(s) {sorted(unknown)}; known: {sorted(hints)}")
    checked = {}
    for key, value in values.items():
        kind = hints[key]
        options = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
        nested = next((o for o in options if dataclasses.is_dataclass(o)), None)
        if nested is not None and isinstance(value, dict):
            checked[key] = typed_from_dict(nested, value, f"{where}.{key}")
        elif not any(matches(value, option) for option in options):
            raise ValueError(f"{where}.{key} must be {' or '.join(map(described, options))}, got {value!r}")
        else:
            checked[key] = value
    return cls(**checked)


def matches(value, kind) -> bool:
    """Whether a JSON value fits a field type: an int is a float too, a bool is never a number."""
    if isinstance(kind, types.UnionType):
        return any(matches(value, option) for option in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    origin = typing.get_origin(kind)
    if origin is list:
        (item,) = typing.get_args(kind)
        return isinstance(value, list) and all(matches(v, item) for v in value)
    return isinstance(value, kind)


def described(kind) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    if isinstance(kind, types.UnionType):
        return " or ".join(map(described, typing.get_args(kind)))
    if typing.get_origin(kind) is list:
        return f"a list of {described(typing.get_args(kind)[0]).removeprefix('a ').removeprefix('an ')}s"
    return names.get(kind, f"a {kind.__name__} object")


def apply_override(config: dict, assignment: str) -> None:
    """`train.steps=200` or `model.memory="none"`: the value is JSON if it parses, else a string."""
    if "=" not in assignment:
        raise ValueError(f"override {assignment!r} is not of the form section.key=value")
    path, raw = assignment.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    *parents, leaf = path.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def load_training_config(path: str | os.PathLike, overrides: list[str] = ()) -> TrainingConfig:
    """Read a training config (JSON), apply `section.key=value` overrides, and check it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training config {path} does not exist")
    config = json.loads(path.read_text())
    for assignment in overrides:
        apply_override(config, assignment)
    return TrainingConfig.from_dict(config, str(path))
