"""Training with `accelerate`: variable-length byte windows, AdamW + warm-up/cosine, exact resume.

    kathleen-notebook train CONFIG.json [section.key=value ...] [--resume]

One CPU process by default; `scripts/train.py` under `torchrun --nproc_per_node N` runs data-parallel. A training
config (JSON) has four sections, each checked for unknown keys before anything runs:

    model   KathleenConfig fields, or {"base_config": {...}, "notebook_config": {...}}: the notebook
            adapter on any Transformers causal LM (NotebookAdapterConfig)
    data    train / eval corpora: {"files": [...], "format": "text" | "json", "column": "text",
            "byte_range": [start, end]}, {"dataset": id, "name": ..., "split": ..., "column": ...},
            or needle haystacks {"needle": {"n_needles": 1, "marker": true, "filler_file": null}};
            a corpus with "facts": {"probability": 0.5, "max_facts": 4} mixes in fact documents (facts.py's
            training part); with train.stream_windows > 1 a fact document spans a whole stream
    train   the recipe (TRAIN_DEFAULTS below)
    output_dir

Batches are a pure function of (seed, step): the step's length is uniform in [min_length, max_length]
and every window start is drawn from a generator seeded with (seed, step), so a resumed run sees
exactly the batches an uninterrupted one would. This module is not part of the remote code.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .configuration_kathleen import EOS_ID, KathleenConfig
from .configuration_notebook_adapter import NotebookAdapterConfig
from .tokenization_kathleen import bytes_to_ids

logger = logging.getLogger(__name__)

TRAIN_DEFAULTS = {
    "seed": 42,
    "lr": 2e-3,  # SPEC §5: 3e-3 for needles, 2e-3 for text
    "weight_decay": 0.01,
    "clip": 1.0,
    "batch_size": 32,
    "min_length": 128,
    "max_length": 512,
    "steps": 1000,
    "warmup_steps": 100,
    "min_lr_ratio": 0.1,  # cosine decays to this fraction of lr
    "max_minutes": None,  # stop early (and save) after this much wall time
    "time_schedule": False,  # the cosine runs over max_minutes of wall time instead of `steps` (equal-time budgets)
    "eval_every": 100,
    "eval_windows": 64,
    "eval_length": 512,
    "save_every": 200,
    "log_every": 10,
    "threads": 1,
    "oracle_gate": False,  # needle data only: the haystack's oracle mask replaces the notebook's β
    "write_penalty": 0.0,  # a write budget: adds write_penalty · mean β to the loss, so ordinary text is not written
    # > 1: each batch row reads a stream of this many consecutive windows, the model's state carried (detached)
    # from one step to the next, so a fact can be asked many windows after it was read (text data only)
    "stream_windows": 1,
}
DATA_KEYS = {"files", "format", "column", "byte_range", "dataset", "name", "split", "needle", "facts"}
NEEDLE_KEYS = {"n_needles", "marker", "filler_file"}
SECTIONS = {"model", "data", "train", "output_dir", "_comment"}


# ---- configuration ---------------------------------------------------------------------------


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


def load_training_config(path: str | os.PathLike, overrides: list[str] = ()) -> dict:
    """Read, override and check a training config; every problem raises before training starts."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training config {path} does not exist")
    config = json.loads(path.read_text())
    for assignment in overrides:
        apply_override(config, assignment)
    unknown = set(config) - SECTIONS
    if unknown:
        raise ValueError(f"unknown section(s) {sorted(unknown)} in {path}; expected {sorted(SECTIONS - {'_comment'})}")
    unknown = set(config.get("train", {})) - set(TRAIN_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown train key(s) {sorted(unknown)} in {path}; known: {sorted(TRAIN_DEFAULTS)}")
    config["train"] = {**TRAIN_DEFAULTS, **config.get("train", {})}
    train = config["train"]
    for key, default in TRAIN_DEFAULTS.items():  # the type of each default (a number where it is None or float)
        value = train[key]
        kind = bool if isinstance(default, bool) else int if isinstance(default, int) else (int, float)
        if (value is None and default is None) or (isinstance(value, kind) and not (
                isinstance(value, bool) and kind is not bool)):
            continue
        raise ValueError(f"train.{key} must be {'true or false' if kind is bool else 'a number'}"
                         f"{' (an integer)' if kind is int else ''}, got {value!r}")
    if not 1 <= train["min_length"] <= train["max_length"]:
        raise ValueError(f"train.min_length/max_length must satisfy 1 <= min <= max, got {train}")
    if train["time_schedule"] and not train["max_minutes"]:
        raise ValueError("train.time_schedule needs train.max_minutes (the wall time the schedule runs over)")
    if not isinstance(train["stream_windows"], int) or train["stream_windows"] < 1:
        raise ValueError(f"train.stream_windows must be a positive integer, got {train['stream_windows']!r}")
    if train["stream_windows"] > 1 and train["save_every"] % train["stream_windows"]:
        raise ValueError(f"train.save_every ({train['save_every']}) must be a multiple of train.stream_windows "
                         f"({train['stream_windows']}) so that checkpoints fall between streams")
    config_class = type(model_config(config.get("model", {})))  # raises on a bad value
    known = set(inspect.signature(config_class.__init__).parameters) - {"self", "kwargs"}
    unknown = set(config.get("model", {})) - known
    if unknown:
        raise ValueError(f"unknown model key(s) {sorted(unknown)} in {path}; known: {sorted(known)}")
    for split in ("train", "eval"):
        spec = config.get("data", {}).get(split)
        if spec is None:
            raise ValueError(f"{path} needs data.{split}")
        unknown = set(spec) - DATA_KEYS
        if unknown:
            raise ValueError(f"unknown data.{split} key(s) {sorted(unknown)} in {path}; known: {sorted(DATA_KEYS)}")
        unknown = set(spec.get("needle", {})) - NEEDLE_KEYS
        if unknown:
            raise ValueError(f"unknown data.{split}.needle key(s) {sorted(unknown)}; known: {sorted(NEEDLE_KEYS)}")
        for file in [*spec.get("files", []), *filter(None, [spec.get("needle", {}).get("filler_file")])]:
            if not Path(file).is_file():
                raise FileNotFoundError(f"data.{split} file {file} does not exist (paths are relative to the "
                                        f"working directory {os.getcwd()})")
    if "output_dir" not in config:
        raise ValueError(f"{path} needs an output_dir")
    return config


def model_config(section: dict) -> KathleenConfig | NotebookAdapterConfig:
    """The config a training config's model section describes: the notebook adapter when it names a
    base_config, the Kathleen model otherwise."""
    return NotebookAdapterConfig(**section) if "base_config" in section else KathleenConfig(**section)


# ---- data ------------------------------------------------------------------------------------


def load_corpus(spec: dict) -> torch.Tensor:
    """Token ids of a corpus through `datasets`, each document preceded by the separator (eos).

    byte_range [start, end) selects bytes of the concatenated documents (for one file: its offsets).
    """
    from datasets import load_dataset

    column = spec.get("column", "text")
    if "files" in spec:
        kind = spec.get("format", "text")
        extra = {"sample_by": "document"} if kind == "text" else {}
        dataset = load_dataset(kind, data_files=list(spec["files"]), split="train", **extra)
    else:
        dataset = load_dataset(spec["dataset"], spec.get("name"), split=spec.get("split", "train"))
    start, end = spec.get("byte_range", [0, None])
    pieces, offset = [], 0
    for document in dataset[column]:
        data = document.encode("utf-8")
        lo, hi = max(start - offset, 0), len(data) if end is None else min(end - offset, len(data))
        if lo < hi:
            pieces.append(torch.tensor([EOS_ID]))
            pieces.append(bytes_to_ids(data[lo:hi]))
        offset += len(data)
    if not pieces:
        raise ValueError(f"the corpus {spec} is empty after byte_range selection")
    return torch.cat(pieces)


class StepBatches(torch.utils.data.Dataset):
    """Sample i of a run belongs to step i // batch_size; its length and content depend on (seed, i) only,
    so a run resumed at any step sees exactly the batches an uninterrupted one would."""

    def __init__(self, train: dict, first_step: int = 0):
        self.train, self.first_step = train, first_step

    def __len__(self) -> int:
        return (self.train["steps"] - self.first_step) * self.train["batch_size"]

    def length_of_step(self, step: int) -> int:
        g = torch.Generator().manual_seed(self.train["seed"] * 1_000_003 + step)
        return int(torch.randint(self.train["min_length"], self.train["max_length"] + 1, (1,), generator=g))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = self.first_step * self.train["batch_size"] + index
        return self.make(sample, self.length_of_step(sample // self.train["batch_size"]))

    def make(self, sample: int, length: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class TextWindows(StepBatches):
    """Windows of a corpus at starts drawn from (seed, sample)."""

    def __init__(self, corpus: torch.Tensor, train: dict, first_step: int = 0):
        super().__init__(train, first_step)
        self.corpus = corpus
        if len(corpus) <= train["max_length"] + 1:
            raise ValueError(f"the training corpus has {len(corpus)} tokens; windows need {train['max_length'] + 1}")

    def make(self, sample: int, length: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.train["seed"] * 7_919 + sample)
        start = int(torch.randint(0, len(self.corpus) - length, (1,), generator=g))
        return {"input_ids": self.corpus[start:start + length]}


class TextWithFacts(TextWindows):
    """Corpus windows; a fraction of them become fact documents (real text with synthetic facts planted
    and stated again), so the notebook learns to write a fact once and recall it later."""

    def __init__(self, corpus: torch.Tensor, spec: dict, train: dict, first_step: int = 0):
        super().__init__(corpus, train, first_step)
        self.probability, self.max_facts = spec.get("probability", 0.5), spec.get("max_facts", 4)

    def make(self, sample: int, length: int) -> dict[str, torch.Tensor]:
        from .facts import fact_document
        from .tokenization_kathleen import ids_to_bytes

        window = super().make(sample, length)
        rng = random.Random(self.train["seed"] * 31_337 + sample)
        if rng.random() >= self.probability:
            return window
        return {"input_ids": fact_document(ids_to_bytes(window["input_ids"]), length, self.max_facts, rng)}


class NeedleHaystacks(StepBatches):
    """Needle haystacks (SPEC §6.1) of the step's length, with their oracle write masks."""

    def __init__(self, spec: dict, train: dict, first_step: int = 0):
        super().__init__(train, first_step)
        self.spec = spec
        self.filler = Path(spec["filler_file"]).read_bytes() if spec.get("filler_file") else None

    def make(self, sample: int, length: int) -> dict[str, torch.Tensor]:
        from .needle import make_needle_example

        rng = random.Random(self.train["seed"] * 7_919 + sample)
        example = make_needle_example(length, rng, self.spec.get("n_needles", 1), self.spec.get("marker", True),
                                      self.filler)
        return {"input_ids": example.input_ids, "write_mask": example.write_mask()}


class TextStreams(StepBatches):
    """Row r of step s reads window s mod K of stream (s div K, r), K = stream_windows: consecutive stretches of
    one long text whose state the training loop carries from step to step. A stream is a corpus stretch as long
    as its K windows together, or (with probability facts.probability) a fact document of that length whose
    questions come at its very end, so the answers lie up to a whole stream after the facts."""

    def __init__(self, corpus: torch.Tensor, spec: dict | None, train: dict, first_step: int = 0):
        super().__init__(train, first_step)
        self.corpus, self.windows = corpus, train["stream_windows"]
        self.probability = 0.0 if spec is None else spec.get("probability", 0.5)
        self.max_facts = 4 if spec is None else spec.get("max_facts", 4)
        self._stream_key, self._stream = None, None
        if len(corpus) <= self.windows * train["max_length"] + 1:
            raise ValueError(f"the training corpus has {len(corpus)} tokens; streams need "
                             f"{self.windows * train['max_length'] + 1}")

    def make(self, sample: int, length: int) -> dict[str, torch.Tensor]:
        step, row = divmod(sample, self.train["batch_size"])
        first = step - step % self.windows  # the stream's first step
        offset = sum(self.length_of_step(s) for s in range(first, step))
        return {"input_ids": self.stream(first, row)[offset:offset + length]}

    def stream(self, first: int, row: int) -> torch.Tensor:
        """The whole text of stream (first step, row), built once and kept while its windows are asked for."""
        if self._stream_key != (first, row):
            from .facts import fact_document
            from .tokenization_kathleen import ids_to_bytes

            total = sum(self.length_of_step(s) for s in range(first, first + self.windows))
            rng = random.Random(self.train["seed"] * 7_919 + first * 1_000_003 + row)
            start = rng.randrange(0, len(self.corpus) - total)
            text = self.corpus[start:start + total]
            if rng.random() < self.probability:
                text = fact_document(ids_to_bytes(text), total, self.max_facts, rng)
            self._stream_key, self._stream = (first, row), text
        return self._stream


def training_batches(data: dict, train: dict, first_step: int = 0) -> StepBatches:
    if "needle" in data:
        return NeedleHaystacks(data["needle"], train, first_step)
    if train["stream_windows"] > 1:
        return TextStreams(load_corpus(data), data.get("facts"), train, first_step)
    if "facts" in data:
        return TextWithFacts(load_corpus(data), data["facts"], train, first_step)
    return TextWindows(load_corpus(data), train, first_step)


def held_out_batches(data: dict, train: dict) -> list[dict[str, torch.Tensor]]:
    """Fixed evaluation batches: evenly spaced corpus windows, or needle haystacks from their own seed."""
    n, length = train["eval_windows"], train["eval_length"]
    if "needle" in data:
        source = NeedleHaystacks(data["needle"], {**train, "seed": train["seed"] + 10_000})
        examples = [source.make(i, length) for i in range(n)]
    else:
        corpus = load_corpus(data)
        length = min(length, len(corpus))
        starts = torch.linspace(0, len(corpus) - length, n).long().unique().tolist()
        examples = [{"input_ids": corpus[s:s + length]} for s in starts]
    return [torch.utils.data.default_collate(examples[i:i + 16]) for i in range(0, len(examples), 16)]


@torch.no_grad()
def bits_per_byte(model, batches: list[dict[str, torch.Tensor]], oracle_gate: bool = False) -> float:
    """Mean next-token cross-entropy over fixed batches, in bits (state empty at each window start)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        ids = batch["input_ids"].to(model.device)
        extra = {"write_mask": batch["write_mask"].to(model.device)} if oracle_gate else {}
        loss = model(ids, labels=ids, use_cache=False, **extra).loss
        n = ids.shape[0] * (ids.shape[1] - 1)
        total, count = total + loss.item() * n, count + n
    model.train(was_training)
    return total / count / math.log(2)


# ---- the loop --------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    step: int
    folder: Path


def latest_checkpoint(output_dir: Path) -> Checkpoint | None:
    """The newest checkpoint whose save completed (a SIGKILL mid-save leaves no COMPLETE marker)."""
    done = [p for p in (output_dir / "checkpoints").glob("step_*") if (p / "COMPLETE").exists()]
    if not done:
        return None
    folder = max(done, key=lambda p: int(p.name.split("_")[1]))
    return Checkpoint(int(folder.name.split("_")[1]), folder)


def train(config: dict, resume: bool = False) -> Path:
    """Run the training described by `config` (see `load_training_config`); returns the output folder."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, set_seed
    from tqdm.auto import tqdm

    from .modeling_kathleen import KathleenForCausalLM
    from .modeling_notebook_adapter import NotebookAdapterForCausalLM

    hp = config["train"]
    torch.set_num_threads(hp["threads"])
    output_dir = Path(config["output_dir"])
    # split_batches: every process takes a slice of the same global batch, so the run's arithmetic
    # (batch size, lengths, schedule) does not depend on how many processes share it
    # several processes on a machine without CUDA (torchrun): gloo on the CPU, else each process would think it
    # is the only one (rank 0 everywhere, all writing the same output folder)
    cpu = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()
    accelerator = Accelerator(cpu=cpu, dataloader_config=DataLoaderConfiguration(split_batches=True))
    checkpoint = latest_checkpoint(output_dir) if resume else None
    if accelerator.is_main_process:
        if not resume and (output_dir / "checkpoints").exists():
            raise FileExistsError(f"{output_dir} already holds a run; pass --resume or choose another output_dir")
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "config.json").write_text(json.dumps(config, indent=2))
    accelerator.wait_for_everyone()

    set_seed(hp["seed"])  # modules are built after seeding (SPEC §5)
    settings = model_config(config["model"])
    adapter = isinstance(settings, NotebookAdapterConfig)
    model = NotebookAdapterForCausalLM(settings) if adapter else KathleenForCausalLM(settings)
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])

    started, minutes_before = time.perf_counter(), 0.0  # both set again when the loop starts

    def schedule(step: int) -> float:
        if step < hp["warmup_steps"]:
            return (step + 1) / hp["warmup_steps"]
        if hp["time_schedule"]:  # arms of different speed all end their cosine when the budget ends
            progress = (minutes_before + (time.perf_counter() - started) / 60) / hp["max_minutes"]
        else:
            progress = (step - hp["warmup_steps"]) / max(1, hp["steps"] - hp["warmup_steps"])
        return hp["min_lr_ratio"] + (1 - hp["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    start_step = 0
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint.folder / "state"))
        start_step = checkpoint.step
        logger.info("resumed from %s at step %d", checkpoint.folder, start_step)

    held_out = held_out_batches(config["data"]["eval"], hp)
    loader = torch.utils.data.DataLoader(training_batches(config["data"]["train"], hp, start_step),
                                         batch_size=hp["batch_size"])
    loader = accelerator.prepare_data_loader(loader)  # each process gets its share of every batch

    metrics_path = output_dir / "metrics.jsonl"
    previous = []
    if resume and metrics_path.exists():
        previous = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    # the wall-time budget counts every minute spent so far, including steps lost to the interruption
    minutes_before = max((r["minutes"] for r in previous), default=0.0)
    if accelerator.is_main_process:  # drop lines from after the checkpoint we resume from
        metrics_path.write_text("".join(json.dumps(r) + "\n" for r in previous if r["step"] <= start_step))

    def log(record: dict) -> None:
        if accelerator.is_main_process:
            with metrics_path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")

    def save(step: int) -> None:
        folder = output_dir / "checkpoints" / f"step_{step}"
        accelerator.save_state(str(folder / "state"))
        if accelerator.is_main_process:
            accelerator.unwrap_model(model).save_pretrained(folder / "model")
            (folder / "COMPLETE").write_text(str(step))  # written last: the checkpoint is whole
            older = sorted(output_dir.glob("checkpoints/step_*"), key=lambda p: int(p.name.split("_")[1]))
            for old in older[:-2]:  # keep the newest two
                shutil.rmtree(old)
        accelerator.wait_for_everyone()

    model.train()
    started, seen, step = time.perf_counter(), 0, start_step
    bar = tqdm(total=hp["steps"], initial=start_step, disable=not accelerator.is_main_process, desc="train")
    streaming, carried = hp["stream_windows"] > 1, None
    for batch in loader:
        ids = batch["input_ids"]
        extra = {"write_mask": batch["write_mask"]} if hp["oracle_gate"] else {}
        if streaming:  # a new stream every stream_windows steps; within one, the state of the step before
            extra["cache"] = None if step % hp["stream_windows"] == 0 else carried
        if hp["write_penalty"] > 0:
            extra["output_write_strengths"] = True
        out = model(ids, labels=ids, use_cache=streaming, **extra)
        loss = out.loss
        if hp["write_penalty"] > 0:
            loss = loss + hp["write_penalty"] * out.write_strengths.mean()
        if streaming:  # truncated in time: the next step starts from this state, not through its graph
            carried = out.cache
            carried._map(torch.Tensor.detach)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), hp["clip"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        seen += ids.numel() * accelerator.num_processes
        rate = seen / (time.perf_counter() - started)
        bpb = out.loss.item() / math.log(2)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", bpb=f"{bpb:.3f}", bytes_per_s=f"{rate:,.0f}")
        record = {"step": step, "train_bpb": bpb, "lr": scheduler.get_last_lr()[0], "length": ids.shape[1],
                  "bytes_per_s": rate, "minutes": minutes_before + (time.perf_counter() - started) / 60}
        if out.write_strengths is not None:
            record["mean_beta"] = out.write_strengths.mean().item()
        out_of_time = hp["max_minutes"] is not None and record["minutes"] >= hp["max_minutes"]
        if step % hp["eval_every"] == 0 or step == hp["steps"] or out_of_time:
            record["eval_bpb"] = bits_per_byte(accelerator.unwrap_model(model), held_out, hp["oracle_gate"])
            record["replica_spread"] = replica_spread(accelerator, model)
            record["processes"], record["data_spread"] = accelerator.num_processes, data_spread(accelerator, ids)
            bar.write(f"step {step}: held-out {record['eval_bpb']:.4f} bits/byte")
        if step % hp["log_every"] == 0 or "eval_bpb" in record:
            log(record)
        if step % hp["save_every"] == 0 or step == hp["steps"] or out_of_time:
            save(step)
        if out_of_time:
            break
    bar.close()
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(output_dir / "final")
        plot_metrics(metrics_path, output_dir / "curves.png")
    accelerator.end_training()
    return output_dir


def replica_spread(accelerator, model) -> float:
    """Largest difference between the processes' weight checksums: 0 when data parallelism is in sync."""
    return process_spread(accelerator, torch.stack([p.detach().double().sum() for p in model.parameters()]).sum())


def data_spread(accelerator, ids: torch.Tensor) -> float:
    """Largest difference between the processes' checksums of their last batch: > 0 when each process trained on
    its own share of the data (with a replica spread of 0, the gradients were averaged across processes)."""
    return process_spread(accelerator, ids.double().sum())


def process_spread(accelerator, checksum: torch.Tensor) -> float:
    """max - min of one number gathered from every process."""
    gathered = accelerator.gather(checksum.reshape(1).to(accelerator.device))
    return float(gathered.max() - gathered.min())


def plot_metrics(metrics_path: Path, png_path: Path) -> None:
    """Train and held-out bits/byte against step, as a PNG beside the metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot([r["step"] for r in records], [r["train_bpb"] for r in records], label="train (batch)", alpha=0.6)
    evals = [r for r in records if "eval_bpb" in r]
    axis.plot([r["step"] for r in evals], [r["eval_bpb"] for r in evals], "o-", label="held-out")
    axis.set_xlabel("step")
    axis.set_ylabel("bits / byte")
    axis.set_title(metrics_path.parent.name)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(png_path, dpi=120)
    plt.close(figure)
