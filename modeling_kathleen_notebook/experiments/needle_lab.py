"""The needle laboratory (SPEC §6.1, issue 5): train the four arms, test them zero-shot at longer lengths.

    kathleen-notebook needle [--quick] [--spec configuration/experiments/needle.json] [--out runs/needle]

Everything it does is read from the pre-registered experiment spec. Training runs are ordinary
`kathleen-notebook train` runs (two at a time, one thread each; rerun the command after an interruption and each
unfinished run resumes from its newest checkpoint); evaluation is exact teacher-forced
value-byte accuracy on fresh haystacks, binned by needle-to-query distance (thirds of the length;
the far bin is the headline), read out three ways: full logits, memory only and trunk only.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..session import NotebookSession
from .lab_report import read_metrics, training_curves
from .needle import KEY_LENGTH, MARKER, VALUE_LENGTH, make_needle_example
from .needle_report import BINS, write_report

logger = logging.getLogger(__name__)


def distance_bin(distance: int, length: int) -> str:
    return BINS[min(2, 3 * distance // length)]


@torch.no_grad()
def recall_by_distance(model, length: int, haystacks: int, seed: int, oracle_gate: bool) -> dict:
    """Value-byte accuracy per distance bin and read-out at one length: {readout: {bin: acc}}, counts."""
    rng = random.Random(seed * 100_003 + length)
    hits = {readout: {b: [] for b in BINS} for readout in ("full", "memory", "trunk")}
    for _ in range(haystacks):
        example = make_needle_example(length, rng)
        extra = {"write_mask": example.write_mask()[None]} if oracle_gate else {}
        out = model(example.input_ids[None], use_cache=False, **extra)
        where = distance_bin(example.distance, length)
        hits["full"][where].append(example.value_accuracy(out.logits[0]))
        hits["trunk"][where].append(example.value_accuracy(out.trunk_logits[0]))
        if out.memory_logits is not None:
            hits["memory"][where].append(example.value_accuracy(out.memory_logits[0]))
    return {readout: {b: (sum(v) / len(v) if v else None) for b, v in bins.items()}
            for readout, bins in hits.items()} | {"counts": {b: len(hits["full"][b]) for b in BINS}}


@torch.no_grad()
def unlearning_and_attribution(model, length: int, trials: int, seed: int, oracle_gate: bool) -> dict:
    """5 facts read into a NotebookSession; one erased. Full-model recall of the erased and the kept
    facts, and how often the top counterfactual source of a recalled value byte is its own fact.

    Only the haystack is read, not the final query with its answer: a learned gate writes that answer
    too, and a second copy of one fact is not what unlearning a span is asked to remove."""
    rng = random.Random(seed * 7_777 + length)
    erased, retained, provenance = [], [], []
    for trial in range(trials):
        example = make_needle_example(length, rng, n_needles=5)
        haystack = example.input_ids[:example.query_start]
        session = NotebookSession(model)
        session.read(haystack, write_mask=example.write_mask()[:example.query_start] if oracle_gate else None,
                     segments=example.needle_spans)
        key_end = len(MARKER) + KEY_LENGTH  # "<MARK>key", then the value
        facts = [(example.input_ids[a:a + key_end], example.input_ids[a + key_end:a + key_end + VALUE_LENGTH])
                 for a, _ in example.needle_spans]
        victim = trial % 5
        for f, (prompt, value) in enumerate(facts):
            for item in session.attribute(prompt, value, top=1):
                if item.recalled and item.sources:
                    provenance.append(item.sources[0][0].start == example.needle_spans[f][0])
        session.unlearn(span=example.needle_spans[victim])
        for f, (prompt, value) in enumerate(facts):
            query = torch.cat([prompt, value]).unsqueeze(0)
            cache = copy.deepcopy(session.cache)
            mask = {"write_mask": torch.zeros(query.shape)} if oracle_gate else {}
            out = model(query, cache=cache, **mask)
            answered = out.logits[0, key_end - 1:key_end - 1 + VALUE_LENGTH]  # the positions that predict the value
            accuracy = (answered.argmax(-1) == value).float().mean().item()
            (erased if f == victim else retained).append(accuracy)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"erased": mean(erased), "retained": mean(retained), "provenance": mean(provenance),
            "recalled_bytes": len(provenance)}


def arm_config(spec: dict, arm: str, seed: int, setting: dict, out: Path) -> dict:
    """A `kathleen-notebook train` config for one arm and seed of the lab."""
    arm_spec = dict(spec["arms"][arm])
    oracle = arm_spec.pop("oracle_gate", False)
    # a setting may train on its own task (e.g. more queries per haystack); evaluation always asks one needle
    task = {k: v for k, v in {**spec["task"], **setting.get("task", {})}.items()
            if k in ("n_needles", "n_queries", "loss", "marker")}
    return {
        "model": {**spec["model"], **arm_spec},
        "data": {"train": {"needle": task}, "eval": {"needle": task}},
        "train": {**setting["train"], "seed": seed, "oracle_gate": oracle},
        "output_dir": str(out / f"{arm}-seed{seed}"),
    }


def train_arms(configs: list[dict], out: Path, parallel: int = 2) -> None:
    """Run the training configs as `kathleen-notebook train` subprocesses, `parallel` at a time. A finished run is
    not trained again (rerunning a lab redoes only its evaluation); an interrupted one (checkpoints, no final model)
    is resumed from its newest checkpoint, which the trainer refuses if the spec changed since it started."""
    pending, running = list(configs), []
    while pending or running:
        while pending and len(running) < parallel:
            config = pending.pop(0)
            folder = Path(config["output_dir"])
            if (folder / "final" / "model.safetensors").exists():
                continue
            path = out / (folder.name + ".json")
            path.write_text(json.dumps(config, indent=2))
            resume = ["--resume"] if (folder / "checkpoints").exists() else []
            if resume:
                logger.info("resuming %s from its newest checkpoint", folder)
            log = open(out / (folder.name + ".log"), "a" if resume else "w")
            command = [sys.executable, "-m", "modeling_kathleen_notebook.cli", "train", str(path), *resume]
            running.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), config))
        time.sleep(2)
        for process, config in list(running):
            if process.poll() is not None:
                running.remove((process, config))
                if process.returncode != 0:
                    raise RuntimeError(f"training {config['output_dir']} failed; see its .log beside it")


def evaluate_arm(folder: Path, arm: str, oracle: bool, setting: dict, eval_seed: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder / "final").eval()  # Kathleen or the notebook adapter
    ev = setting["eval"]
    notebook = model.config.memory == "notebook"
    lengths = ev["lengths"] + (ev["notebook_extra_lengths"] if notebook else [])
    result = {"parameters": sum(p.numel() for p in model.parameters()), "recall": {}}
    for length in lengths:
        start = time.perf_counter()
        result["recall"][length] = recall_by_distance(model, length, ev["haystacks"], eval_seed, oracle)
        logger.info("  %s %s @ %d: far %s (%.0fs)", arm, folder.name, length, result["recall"][length]["full"]["far"],
                    time.perf_counter() - start)
    if notebook:
        result["unlearning"] = {length: unlearning_and_attribution(model, length, ev["unlearning_trials"], eval_seed,
                                                                    oracle) for length in ev["unlearning_lengths"]}
    return result


def run_lab(spec_path: str, setting_name: str, out: str, report: str, parallel: int = 2,
            command: str = "kathleen-notebook needle", report_only: bool = False) -> dict:
    """Train (or reuse) every arm and seed of the setting, evaluate them, write the report.
    report_only rewrites the report from the results.json of an earlier run."""
    spec = json.loads(Path(spec_path).read_text())
    if setting_name not in spec["settings"]:
        raise ValueError(f"{spec_path} has no setting {setting_name!r}; it has {sorted(spec['settings'])}")
    setting = spec["settings"][setting_name]
    out_dir = Path(out) / setting_name
    if report_only:
        results = with_held_out_curves(json.loads((out_dir / "results.json").read_text()), out_dir)
        write_report(spec, setting_name, results, Path(report), command.replace(" --report-only", ""), spec_path)
        return results
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = [arm_config(spec, arm, seed, setting, out_dir)
               for arm, seeds in setting["seeds"].items() for seed in seeds]
    started = time.perf_counter()
    train_arms(configs, out_dir, parallel)
    logger.info("training done in %.1f min", (time.perf_counter() - started) / 60)
    results = {}
    for config in configs:
        arm = Path(config["output_dir"]).name.rsplit("-seed", 1)[0]
        results[Path(config["output_dir"]).name] = {
            "arm": arm, "seed": config["train"]["seed"],
            **evaluate_arm(Path(config["output_dir"]), arm, config["train"]["oracle_gate"], setting,
                           spec["eval_seed"]),
        }
    results = with_held_out_curves(results, out_dir)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    write_report(spec, setting_name, results, Path(report), command, spec_path)
    return results


def with_held_out_curves(results: dict, out_dir: Path) -> dict:
    """Each run's held-out curve (step, minutes, eval_bpb) from its metrics.jsonl where the run folder is here
    (results.json keeps it for when it is not), and its steps."""
    for name, result in results.items():
        metrics = out_dir / name / "metrics.jsonl"
        if metrics.exists():
            records = read_metrics(metrics)
            result["held_out"], result["steps"] = training_curves(records)["held_out"], records[-1]["step"]
    return results
