"""The training loop with `accelerate`: AdamW with warm-up and cosine, exact resume, evaluation and checkpoints.

    kathleen-notebook train CONFIG.json [section.key=value ...] [--resume]

One CPU process by default; `scripts/train.py` under `torchrun --nproc_per_node N` runs data-parallel. The config is
a `TrainingConfig` (config.py); the batches of a step depend on (seed, step) only (data.py), so a run resumed from
its last checkpoint ends with the weights of an uninterrupted one. `train` is setup (`Run.start`), then per step
`Run.step`, with `Run.evaluate` and `Run.save` on their schedules.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..configuration_notebook_adapter import NotebookAdapterConfig
from ..notebook import Notebook
from .config import DataSpec, TrainingConfig, TrainSettings, model_config, typed_from_dict, without_nones
from .data import held_out_batches, training_batches

logger = logging.getLogger(__name__)
# the newest ones; older checkpoint folders are removed after each save. (accelerate's ProjectConfiguration(
# total_limit=...) rotates only the accelerator states it names itself; a checkpoint here is that state, the model
# folder and the COMPLETE marker that resuming trusts, so the rotation stays with the folders.)
KEPT_CHECKPOINTS = 2
# what save_pretrained adds to a config; any other difference is a different model
SAVED_ONLY_CONFIG_KEYS = {"architectures", "auto_map", "dtype", "transformers_version", "_name_or_path"}
# what a resumed run may change: how it is watched, saved and spread over threads, not what it computes
RESUMABLE_SETTINGS = {"train.threads", "train.log_every", "train.eval_every", "train.save_every"}


@torch.no_grad()
def held_out_bits(model, batches: list[dict[str, torch.Tensor]], oracle_gate: bool = False) -> float:
    """Mean next-token cross-entropy over fixed batches, in bits (state empty at each window start), over the bytes
    their labels score (every byte, unless a batch brings labels)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        ids = batch["input_ids"].to(model.device)
        extra = {"write_mask": batch["write_mask"].to(model.device)} if oracle_gate else {}
        labels = batch.get("labels", batch["input_ids"]).to(model.device)
        loss = model(ids, labels=labels, use_cache=False, **extra).loss
        n = int((labels[:, 1:] != -100).sum())
        total, count = total + loss.item() * n, count + n
    model.train(was_training)
    return total / count / math.log(2)


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


def load_start_weights(model, folder: str) -> None:
    """Copy the weights (and stored keys) of a saved model into `model` (train.init_from); a saved model whose config
    differs from the run's model section raises, naming the keys."""
    saved = type(model).from_pretrained(folder)
    ours, theirs = config_entries(model.config.to_dict()), config_entries(saved.config.to_dict())
    differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if differ:
        raise ValueError(f"train.init_from {folder} holds a different model than the config's model section: "
                         + "; ".join(f"{k}: saved {theirs.get(k)!r}, section {ours.get(k)!r}" for k in differ))
    model.load_state_dict(saved.state_dict())
    logger.info("weights from %s", folder)


def config_entries(config: dict, prefix: str = "") -> dict:
    """A config dict flattened to dotted keys (sub-configs such as an adapter's base_config included), without the
    keys save_pretrained adds."""
    entries = {}
    for key, value in config.items():
        if key in SAVED_ONLY_CONFIG_KEYS:
            continue
        if isinstance(value, dict) and key.endswith("config"):
            entries |= config_entries(value, f"{prefix}{key}.")
        else:
            entries[prefix + key] = value
    return entries


def run_settings(config: dict) -> dict:
    """A training config's JSON (a run's config.json, or `TrainingConfig.to_dict`) as dotted keys with every default
    filled in, so that two spellings of one run compare equal. The output folder is left out: it names the run."""
    data = config.get("data", {})
    entries = {f"model.{k}": v for k, v in config_entries(model_config(config.get("model", {})).to_dict()).items()}
    for split in ("train", "eval"):
        spec = without_nones(typed_from_dict(DataSpec, data.get(split, {}), f"data.{split}"))
        entries |= flattened(spec, f"data.{split}.")
    return entries | flattened(asdict(typed_from_dict(TrainSettings, config.get("train", {}), "train")),
                               "train.")


def flattened(config: dict, prefix: str) -> dict:
    entries = {}
    for key, value in config.items():
        entries |= flattened(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
    return entries


def check_same_run(folder: Path, config: TrainingConfig) -> None:
    """Resuming continues the run a folder holds, so its config must describe that run: a ValueError names every
    setting that differs from the folder's config.json (before anything in the folder changes). Only
    `RESUMABLE_SETTINGS` may change, and `train.max_minutes` where no schedule runs over it (it then only says when
    to stop)."""
    try:
        stored = run_settings(json.loads((folder / "config.json").read_text()))
    except (OSError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"cannot resume {folder}: its config.json is missing or unreadable ({error}); the "
                         f"checkpoints are untouched") from error
    wanted = run_settings(config.to_dict())
    free = set(RESUMABLE_SETTINGS)
    if not stored["train.time_schedule"] and not wanted["train.time_schedule"]:
        free.add("train.max_minutes")
    changed = sorted(k for k in stored.keys() | wanted.keys() if k not in free and stored.get(k) != wanted.get(k))
    if changed:
        raise ValueError(
            f"cannot resume {folder} under a different config: "
            + "; ".join(f"{k}: the run has {stored.get(k)!r}, the config {wanted.get(k)!r}" for k in changed)
            + ". Resume with the run's own config (its config.json), start a new run in another output_dir, or "
              "continue its weights under a new recipe with train.init_from")


def learning_rate_schedule(
    optimizer: torch.optim.Optimizer, hp: TrainSettings, minutes: Callable[[], float]
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up from lr / warmup_steps, then a cosine down to min_lr_ratio · lr over the steps (Transformers'
    `get_cosine_with_min_lr_schedule_with_warmup`), or over max_minutes of wall time with time_schedule (arms of
    different speed all end their cosine with the budget).

    Transformers' warm-up starts at lr 0, one step behind the one every result here was trained with (the reports,
    the shipped checkpoint), and that shift alone changes them; so its factor is asked one step ahead during the
    warm-up, which gives this recipe's factors exactly (tested)."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    cosine = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, hp.warmup_steps, hp.steps, min_lr_rate=hp.min_lr_ratio).lr_lambdas[0]

    def factor(step: int) -> float:
        if step < hp.warmup_steps:
            return cosine(step + 1)
        if hp.time_schedule:
            progress = min(1.0, minutes() / hp.max_minutes)
            return hp.min_lr_ratio + (1 - hp.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return cosine(step)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Run:
    """One training run: the accelerator, model, optimizer, schedule, data and the run's folder."""

    def __init__(self, config: TrainingConfig, resume: bool):
        from accelerate import Accelerator
        from accelerate.utils import DataLoaderConfiguration, set_seed

        from ..modeling_kathleen import KathleenForCausalLM
        from ..modeling_notebook_adapter import NotebookAdapterForCausalLM

        self.config, self.hp = config, config.train
        torch.set_num_threads(self.hp.threads)
        self.output_dir = Path(config.output_dir)
        # split_batches: every process takes a slice of the same global batch, so the run's arithmetic (batch size,
        # lengths, schedule) does not depend on how many processes share it. Several processes on a machine without
        # CUDA (torchrun): gloo on the CPU, else each would think it is the only one (rank 0 everywhere)
        cpu = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()
        self.accelerator = Accelerator(cpu=cpu, dataloader_config=DataLoaderConfiguration(split_batches=True))
        checkpoint = latest_checkpoint(self.output_dir) if resume else None
        if checkpoint is not None:
            check_same_run(self.output_dir, config)
        elif resume and not (self.output_dir / "checkpoints").exists():  # a mistyped folder would start over
            raise FileNotFoundError(f"nothing to resume: {self.output_dir} holds no run; leave out --resume to "
                                    "start one there")
        elif resume:  # killed before its first checkpoint was complete: nothing is lost by starting again
            logger.warning("%s has no complete checkpoint yet: starting from step 0", self.output_dir)
        if self.accelerator.is_main_process:
            if not resume and (self.output_dir / "checkpoints").exists():
                raise FileExistsError(f"{self.output_dir} already holds a run; pass --resume or choose another "
                                      f"output_dir")
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
        self.accelerator.wait_for_everyone()

        set_seed(self.hp.seed)  # modules are built after seeding (SPEC §5)
        settings = config.model_config()
        adapter = isinstance(settings, NotebookAdapterConfig)
        model = NotebookAdapterForCausalLM(settings) if adapter else KathleenForCausalLM(settings)
        if self.hp.init_from is not None:
            load_start_weights(model, self.hp.init_from)
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.hp.lr, weight_decay=self.hp.weight_decay)
        self.started, self.minutes_before = time.perf_counter(), 0.0  # both set again by `start`
        scheduler = learning_rate_schedule(optimizer, self.hp, self.minutes)
        # the notebook's fixed tables are drawn from the key seed alike in every process: DistributedDataParallel
        # need not broadcast them at the start (and gloo cannot send the bound keys' int16 table)
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [f"{prefix}.{name}" for prefix, module in model.named_modules() if isinstance(module, Notebook)
                    for name, _ in module.named_buffers(recurse=False)])
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(model, optimizer, scheduler)
        self.step_count = 0
        if checkpoint is not None:
            self.accelerator.load_state(str(checkpoint.folder / "state"))
            self.step_count = checkpoint.step
            logger.info("resumed from %s at step %d", checkpoint.folder, self.step_count)
        self.held_out = held_out_batches(config.eval_data, self.hp)
        loader = torch.utils.data.DataLoader(training_batches(config.train_data, self.hp, self.step_count),
                                             batch_size=self.hp.batch_size)
        self.loader = self.accelerator.prepare_data_loader(loader)  # each process gets its share of every batch
        self.metrics_path = self.output_dir / "metrics.jsonl"
        previous = []
        if resume and self.metrics_path.exists():
            previous = [json.loads(line) for line in self.metrics_path.read_text().splitlines()]
        # the wall-time budget counts every minute spent so far, including steps lost to the interruption
        self.minutes_before = max((r["minutes"] for r in previous), default=0.0)
        if self.accelerator.is_main_process:  # drop lines from after the checkpoint we resume from
            kept = "".join(json.dumps(r) + "\n" for r in previous if r["step"] <= self.step_count)
            self.metrics_path.write_text(kept)
        self.carried = None  # the detached state of the step before, within a stream (stream_windows > 1)
        self.seen = 0

    def minutes(self) -> float:
        """Wall time of the run so far, including the runs it resumes."""
        return self.minutes_before + (time.perf_counter() - self.started) / 60

    def start(self) -> None:
        self.model.train()
        self.started, self.seen = time.perf_counter(), 0

    def step(self, batch: dict[str, torch.Tensor]) -> dict:
        """One optimizer step on a batch; returns its metrics record."""
        hp, ids = self.hp, batch["input_ids"]
        streaming = hp.stream_windows > 1
        extra = {"write_mask": batch["write_mask"]} if hp.oracle_gate else {}
        if streaming:  # a new stream every stream_windows steps; within one, the state of the step before
            extra["cache"] = None if self.step_count % hp.stream_windows == 0 else self.carried
        if hp.write_penalty > 0:
            extra["output_write_strengths"] = True
        out = self.model(ids, labels=batch.get("labels", ids), use_cache=streaming, **extra)
        loss = out.loss
        if hp.write_penalty > 0:
            loss = loss + hp.write_penalty * out.write_strengths.mean()
        if streaming:  # truncated in time: the next step starts from this state, not through its graph
            self.carried = out.cache
            self.carried._map(torch.Tensor.detach)
        self.accelerator.backward(loss)
        self.accelerator.clip_grad_norm_(self.model.parameters(), hp.clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        self.seen += ids.numel() * self.accelerator.num_processes
        record = {"step": self.step_count, "train_bpb": out.loss.item() / math.log(2),
                  "lr": self.scheduler.get_last_lr()[0], "length": ids.shape[1],
                  "bytes_per_s": self.seen / (time.perf_counter() - self.started), "minutes": self.minutes(),
                  "loss": loss.item()}
        if out.write_strengths is not None:
            record["mean_beta"] = out.write_strengths.mean().item()
        return record

    def evaluate(self, record: dict, ids: torch.Tensor) -> None:
        """Held-out bits/byte, and the checks that data parallelism is in sync, into the step's record."""
        model = self.accelerator.unwrap_model(self.model)
        record["eval_bpb"] = held_out_bits(model, self.held_out, self.hp.oracle_gate)
        record["replica_spread"] = replica_spread(self.accelerator, self.model)
        record["processes"], record["data_spread"] = self.accelerator.num_processes, data_spread(self.accelerator, ids)

    def log(self, record: dict) -> None:
        if self.accelerator.is_main_process:
            with self.metrics_path.open("a") as handle:
                handle.write(json.dumps({k: v for k, v in record.items() if k != "loss"}) + "\n")

    def save(self) -> None:
        """A checkpoint of everything resuming needs; COMPLETE is written last, so a killed save is never resumed."""
        folder = self.output_dir / "checkpoints" / f"step_{self.step_count}"
        self.accelerator.save_state(str(folder / "state"))
        if self.accelerator.is_main_process:
            self.accelerator.unwrap_model(self.model).save_pretrained(folder / "model")
            (folder / "COMPLETE").write_text(str(self.step_count))
            older = sorted(self.output_dir.glob("checkpoints/step_*"), key=lambda p: int(p.name.split("_")[1]))
            for old in older[:-KEPT_CHECKPOINTS]:
                shutil.rmtree(old)
        self.accelerator.wait_for_everyone()

    def finish(self) -> None:
        if self.accelerator.is_main_process:
            self.accelerator.unwrap_model(self.model).save_pretrained(self.output_dir / "final")
            plot_metrics(self.metrics_path, self.output_dir / "curves.png")
        self.accelerator.end_training()


def train(config: TrainingConfig, resume: bool = False) -> Path:
    """Run the training `config` describes (`load_training_config`); returns the output folder."""
    run, hp = Run(config, resume), config.train
    run.start()
    bar = progress_bar(run, hp)
    for batch in run.loader:
        record = run.step(batch)
        step = run.step_count
        bar.update((min(record["minutes"], hp.max_minutes) if hp.time_schedule else step) - bar.n)
        bar.set_postfix(step=step, loss=f"{record['loss']:.3f}", bpb=f"{record['train_bpb']:.3f}",
                        bytes_per_s=f"{record['bytes_per_s']:,.0f}")
        out_of_time = hp.max_minutes is not None and record["minutes"] >= hp.max_minutes
        if step % hp.eval_every == 0 or step == hp.steps or out_of_time:
            run.evaluate(record, batch["input_ids"])
            bar.write(f"step {step}: held-out {record['eval_bpb']:.4f} bits/byte")
        if step % hp.log_every == 0 or "eval_bpb" in record:
            run.log(record)
        if step % hp.save_every == 0 or step == hp.steps or out_of_time:
            run.save()
        if out_of_time:
            break
    bar.close()
    run.finish()
    return run.output_dir


def progress_bar(run: Run, hp: TrainSettings):
    """A tqdm bar of steps out of `steps`, or with a time schedule (where `steps` is only a cap) of minutes out of
    max_minutes: a bar over a cap of a million steps would show an hour's run as 0% with days to go."""
    from tqdm.auto import tqdm

    disable = not run.accelerator.is_main_process
    if hp.time_schedule:
        return tqdm(total=hp.max_minutes, initial=min(run.minutes_before, hp.max_minutes), unit="min", desc="train",
                    disable=disable, bar_format="{l_bar}{bar}| {n:.3g}/{total:g} min [{elapsed}<{remaining}{postfix}]")
    return tqdm(total=hp.steps, initial=run.step_count, unit="step", desc="train", disable=disable)


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
