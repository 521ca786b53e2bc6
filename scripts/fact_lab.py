"""The fact laboratory of issue 18: train every arm of the pre-registered spec for the same wall time, measure
held-out fact recall by length, test bits/byte, the repeat probe, training cost and state size; write the report.

    python scripts/fact_lab.py                         every stage-1 arm (seed 42), then the report
    python scripts/fact_lab.py --stage 2 --arms a,b    the finalists with the stage-2 seeds
    python scripts/fact_lab.py --report-only           rewrite reports/facts.{md,png,json} from the runs' eval.json
                                                       (or, without the runs, from the rows in reports/facts.json)

Defaults: spec configuration/experiments/facts.json, runs under runs/facts/<arm>-s<seed>, two runs at a time with
one thread each. Training runs are ordinary `kathleen-notebook train` processes; each finished run is evaluated in
its own process (`--evaluate RUN`), so a crash loses one run, and finished runs are not trained again.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

READOUTS = ("full", "memory", "trunk")
SHIPPED = Path(__file__).resolve().parents[1] / "modeling_kathleen_notebook" / "pretrained" / "kathleen-notebook-0.5m"
DEFAULTS = {"spec": "configuration/experiments/facts.json", "out": "runs/facts", "report": "reports/facts"}


def merged(base: dict, arm: dict) -> dict:
    """The base training config with an arm's sections laid over it (one level deep per section)."""
    config = copy.deepcopy(base)
    for section, values in arm.items():
        config.setdefault(section, {}).update(values)
    return config


def run_folder(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm.replace('+', '-')}-s{seed}"


def train_and_evaluate(spec_path: str, spec: dict, out: Path, arm: str, seed: int) -> str:
    """Train one arm (unless its final model exists), then evaluate it (unless its eval.json exists)."""
    folder = run_folder(out, arm, seed)
    config = merged(spec["base"], spec["arms"][arm])
    config["train"]["seed"] = seed
    config["output_dir"] = str(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "lab_config.json"
    config_path.write_text(json.dumps(config, indent=1))
    log = (folder / "lab.log").open("a")
    if not (folder / "final" / "config.json").exists():
        resume = ["--resume"] if (folder / "checkpoints").exists() else []
        command = [sys.executable, "-m", "modeling_kathleen_notebook.cli", "train", str(config_path), *resume]
        if subprocess.run(command, stdout=log, stderr=log).returncode != 0:
            return f"{arm} seed {seed}: training failed (see {folder / 'lab.log'})"
    if not (folder / "eval.json").exists():
        command = [sys.executable, __file__, "--spec", spec_path, "--evaluate", str(folder)]
        if subprocess.run(command, stdout=log, stderr=log).returncode != 0:
            return f"{arm} seed {seed}: evaluation failed (see {folder / 'lab.log'})"
    return f"{arm} seed {seed}: done"


# ---- evaluation of one run -------------------------------------------------------------------------------


def step_seconds(model, ids: torch.Tensor) -> float:
    """One forward + backward of a training batch, in seconds."""
    started = time.perf_counter()
    model(ids, labels=ids, use_cache=False).loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def relative_cost(model, rounds: int = 5) -> float:
    """Training-step time of `model` over a bare trunk of its size, interleaved in this process (median ratio)."""
    from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM

    torch.manual_seed(0)
    trunk = KathleenForCausalLM(KathleenConfig(**{**model.config.to_dict(), "memory": "none"})).train()
    model.train()
    ids = torch.randint(3, 259, (16, 512), generator=torch.Generator().manual_seed(0))
    step_seconds(model, ids), step_seconds(trunk, ids)  # warm-up (kernel build, allocator)
    ratios = [step_seconds(model, ids) / step_seconds(trunk, ids) for _ in range(rounds)]
    model.eval()
    return statistics.median(ratios)


def evaluate_run(spec: dict, folder: Path) -> dict:
    """Everything the report needs about one finished run; written to folder/eval.json."""
    from transformers import AutoModelForCausalLM

    import modeling_kathleen_notebook  # noqa: F401  registers the Auto classes
    from modeling_kathleen_notebook.experiments.fact_recall import evaluate_fact_recall
    from modeling_kathleen_notebook.experiments.repeat_probe import probe
    from modeling_kathleen_notebook.scoring import bits_per_byte
    from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

    torch.set_num_threads(1)
    settings = spec["eval"]
    name, start, end = settings["corpus"].split(":")
    test = Path(name).read_bytes()[int(start):int(end)]
    model = AutoModelForCausalLM.from_pretrained(folder / "final").eval()
    notebook = model.config.memory == "notebook"
    result = {"run": folder.name, "memory": model.config.memory}
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    result["steps"], result["train_minutes"] = metrics[-1]["step"], metrics[-1]["minutes"]
    result["curve"] = [(r["step"], r["minutes"], r["train_bpb"]) for r in metrics]
    with torch.no_grad():
        result["test_bpb"] = bits_per_byte(model, bytes_to_ids(test), window=settings["bpb_window"])
        result["repeat"] = {str(L): probe(model, test, L, with_gate=notebook) for L in settings["repeat_lengths"]}
        if notebook or model.config.memory == "attention":
            result["facts"] = evaluate_fact_recall(model, test, settings["lengths"], settings["documents"],
                                                   settings["facts"], settings["seed"], settings["split"],
                                                   progress=False)
            result["facts_train_split"] = evaluate_fact_recall(
                model, test, [settings["train_split_length"]], settings["documents"], settings["facts"],
                settings["seed"], "train", progress=False)
        cache = model(bytes_to_ids(test[:100]).unsqueeze(0)).cache
    result["state_bytes"] = sum(t.numel() * t.element_size() for t in cache.state_tensors().values())
    result["cost_vs_trunk"] = relative_cost(model)
    if notebook:
        memory = model.model.memory
        result["forget_rate"] = float(memory.forget_rate())
        result["read_scale"] = float(memory.read_scale)
    (folder / "eval.json").write_text(json.dumps(result, indent=1))
    return result


# ---- the report ------------------------------------------------------------------------------------------


def cell(value: float | None, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def repeat_gains(row: dict, trunk: dict, length: str) -> dict:
    """Extra repeat gain per distance bin and first-mention cost against the trunk arm (SPEC §6.2)."""
    mine, base = row["repeat"][length], trunk["repeat"][length]
    gains = {}
    for key in [k for k in mine if k.startswith("bpb_repeat")]:
        gains[key.removeprefix("bpb_repeat").lstrip("_") or "all"] = (
            (mine["bpb_first"] - mine[key]) - (base["bpb_first"] - base[key]))
    return {"gain": gains, "first_cost": mine["bpb_first"] - base["bpb_first"]}


def recipe_seeds(report: Path) -> list[tuple[str, dict]]:
    """The shipped checkpoint's measurements and those of its recipe rerun from other trunk seeds
    (reports/facts_recipe_seed*.json, measure_checkpoint.py records), each named by its training command."""
    records = [SHIPPED / "measurements.json", *sorted(report.parent.glob(f"{report.name}_recipe_seed*.json"))]
    found = [json.loads(path.read_text()) for path in records if path.exists()]
    return [(m["training_command"], m) for m in found if "fact_recall" in m]


def seed_rows(seeds: list[tuple[str, dict]]) -> list[str]:
    """One table row per trunk seed of the shipped recipe: recall, bits/byte against its own trunk, the 8x repeat
    probe, unlearning (a part a record did not measure shows as '-')."""
    lines = ["| trunk trained by | greedy 512 / 2,048 / 8,192 / 16,384 | first / second half @16,384 | "
             "test bpb stream: model / its bare trunk | repeat probe @4,096: first-mention cost / extra gain "
             "(all, >= 1,024) | unlearning: erased after / others after |", "|---|---|---|---|---|---|"]
    for training, m in seeds:
        facts = m["fact_recall"]
        far = facts["16384"]
        probe = m.get("repeat_probe", {}).get("4096")
        probe_cell = (f"{cell(probe['first_mention_cost'], True)} / {cell(probe['extra_repeat_gain']['all'], True)}, "
                      f"{cell(probe['extra_repeat_gain']['1024-inf'], True)}" if probe else "-")
        unlearn = m.get("unlearning")
        unlearn_cell = f"{cell(unlearn['erased_after'])} / {cell(unlearn['kept_after'])}" if unlearn else "-"
        lines.append(f"| `{training}` | " + " / ".join(cell(facts[L]["greedy"]) for L in facts) +
                     f" | {cell(far['first_half']['greedy'])} / {cell(far['second_half']['greedy'])} | "
                     f"{m['test_bpb']:.4f} / {cell(m.get('trunk_test_bpb'))} | {probe_cell} | {unlearn_cell} |")
    return lines


def write_report(spec: dict, out: Path, report: Path, command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from modeling_kathleen_notebook.experiments.lab_report import rows_from_runs, save_report

    rows = rows_from_runs({f"{arm} (seed {seed})": run_folder(out, arm, seed) / "eval.json" for arm in spec["arms"]
                           for seed in spec["seeds"]["stage1"] + spec["seeds"]["stage2"]}, report)
    trunk = next((r for name, r in rows.items() if name.startswith("trunk ")), None)
    lengths = [str(L) for L in spec["eval"]["lengths"]]
    lines = [f"# {spec['title']}", "", f"Pre-registered spec: `configuration/experiments/facts.json` "
             f"(registered {spec['registered']}). Regenerate: `{command}`.", "",
             f"Question: {spec['question']}", "",
             "Every arm: the 0.5M text model, one thread, the same wall-clock budget "
             f"({spec['base']['train']['max_minutes']} minutes, cosine over the budget), enwiki train split with fact "
             "documents (training part of facts.py). Recall: greedy value-byte accuracy on the **held-out** part "
             f"(templates, names, alphabets never trained on), {spec['eval']['facts']} facts per document, "
             f"{spec['eval']['documents']} documents per length, enwiki test split as filler, seed "
             f"{spec['eval']['seed']}. Bits/byte: enwiki test split in windows of {spec['eval']['bpb_window']}.", "",
             "## Held-out fact recall (greedy) and cost", "",
             "| arm | steps | " + " | ".join(f"{int(L):,}" for L in lengths) +
             f" | mean | first / second half @{int(lengths[-1]):,} | train-part recall @2,048 | test bpb | "
             "cost vs trunk | state bytes |",
             "|---|---|" + "---|" * len(lengths) + "---|---|---|---|---|---|"]
    for name, row in rows.items():
        facts = row.get("facts")
        recall = [facts[L]["greedy"] if facts else None for L in lengths]
        mean = sum(recall) / len(recall) if facts else None
        far = facts[lengths[-1]] if facts else None
        halves = f"{cell(far['first_half']['greedy'])} / {cell(far['second_half']['greedy'])}" if far else "-"
        train_part = row["facts_train_split"][str(spec["eval"]["train_split_length"])]["greedy"] if facts else None
        lines.append(f"| {name} | {row['steps']:,} | " + " | ".join(cell(v) for v in recall) + f" | {cell(mean)} | "
                     f"{halves} | {cell(train_part)} | {row['test_bpb']:.4f} | {row['cost_vs_trunk']:.2f}x | "
                     f"{row['state_bytes']:,} |")
    shipped = SHIPPED / "measurements.json"
    if shipped.exists() and "fact_recall" in json.loads(shipped.read_text()):
        m = json.loads(shipped.read_text())
        facts = m["fact_recall"]
        lines += ["", "## The shipped checkpoint", "",
                  f"Measured by `{m['measure_command']}` (its model card has the rest); trained by "
                  f"`{m['training_command']}`. Greedy / teacher-forced full / memory-only / trunk-only recall of "
                  f"held-out facts, {m['facts_per_document']} per document, {m['fact_documents']} documents per "
                  f"length, seed {m['seed']}:", "",
                  "| length | greedy | teacher-forced | memory only | trunk only | first half / second half (greedy) |",
                  "|---|---|---|---|---|---|"]
        for length, r in facts.items():
            halves = f"{cell(r['first_half']['greedy'])} / {cell(r['second_half']['greedy'])}"
            lines.append(f"| {int(length):,} | {cell(r['greedy'])} | {cell(r['full'])} | {cell(r['memory'])} | "
                         f"{cell(r['trunk'])} | {halves} |")
        lines += ["", f"Test bits/byte (first {m['bpb_bytes']:,} bytes of the test split): shipped {m['test_bpb']:.4f} "
                  f"(stream) / {m['test_bpb_2048']:.4f} (windows of 2,048); the equal-time bare trunk "
                  f"{m['trunk_test_bpb']:.4f} / {m['trunk_test_bpb_2048']:.4f}."]
    seeds = recipe_seeds(report)
    if len(seeds) > 1:
        lines += ["", "## The shipped recipe, trunk seed by trunk seed", "",
                  "Each trunk trained by the command named, then given the shipped checkpoint's notebook and a read "
                  "trust fitted as its own was (README, Experiments; the commands are in the records "
                  f"`{report.name}_recipe_seed*.json`); held-out facts, 8 per document, 8 documents per length, test "
                  "split, seed 0. The first row is the shipped checkpoint.", "", *seed_rows(seeds)]
    grid = report.with_name("write_rule_grid.json")  # scripts/write_rule_grid.py --out (an untrained notebook)
    if grid.exists():
        g = json.loads(grid.read_text())
        grid_lengths = list(g["rows"][0]["greedy"])
        lines += ["", "## Surprise writes on a trained trunk, nothing else trained (scripts/write_rule_grid.py)", "",
                  f"Regenerate: `{g['command']}`. Held-out facts as above; greedy / teacher-forced recall.", "",
                  "| R | shift c (nats) | scale a | read scale s | " + " | ".join(f"{int(L):,}" for L in grid_lengths)
                  + " |", "|---|---|---|---|" + "---|" * len(grid_lengths)]
        for r in g["rows"]:
            lines.append(f"| {r['hrr_dim']:,} | {r['shift']:g} | {r['scale']:g} | {r['read_scale']:g} | " +
                         " | ".join(f"{cell(r['greedy'][L])} / {cell(r['teacher_forced'][L])}"
                                    for L in grid_lengths) + " |")
    lines += ["", "## Teacher-forced recall by read-out (held-out, full / memory only / trunk only)", "",
              "| arm | " + " | ".join(f"{int(L):,}" for L in lengths) + " |", "|---|" + "---|" * len(lengths)]
    for name, row in rows.items():
        if row.get("facts"):
            lines.append(f"| {name} | " + " | ".join(" / ".join(cell(row["facts"][L][r]) for r in READOUTS)
                                                     for L in lengths) + " |")
    if trunk is not None:
        lines += ["", "## Repeat probe against the trunk arm (SPEC §6.2, enwiki test split)", "",
                  "| arm | length | extra repeat gain: all / 64-256 / 256-1024 / >=1024 | first-mention cost | "
                  "mean beta on repeats / elsewhere |", "|---|---|---|---|---|"]
        for name, row in rows.items():
            if row is trunk:
                continue
            for length in row["repeat"]:
                g = repeat_gains(row, trunk, length)
                gains = " / ".join(cell(g["gain"].get(k), True) for k in ("all", "64-256", "256-1024", "1024-inf"))
                betas = row["repeat"][length]
                beta = f"{cell(betas.get('beta_repeat'))} / {cell(betas.get('beta_other'))}"
                lines.append(f"| {name} | {int(length):,} | {gains} | {cell(g['first_cost'], True)} | {beta} |")
    lines += ["", "## Hypotheses (as registered)", ""] + [f"- {h}" for h in spec["hypotheses"]]
    lines += ["", f"Decision rule: {spec['decision_rule']}", ""]
    for amendment in spec.get("amendments", []):
        lines += [f"Amendment ({amendment['date']}): {amendment['what']}"] + [
            f"- {h}" for h in amendment.get("hypotheses", [])] + [""]
    notes = report.with_name(report.name + "_notes.md")  # the analysis, written by hand after the runs
    if notes.exists():
        lines += ["", notes.read_text()]
    report.parent.mkdir(parents=True, exist_ok=True)

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 5.5))
    for name, row in rows.items():
        if row.get("facts"):
            left.plot([int(L) for L in lengths], [row["facts"][L]["greedy"] for L in lengths], "o-", label=name)
        curve = row["curve"]
        right.plot([c[1] for c in curve], [c[2] for c in curve], label=name, alpha=0.7)
    for training, m in seeds[1:]:
        recall = m["fact_recall"]
        left.plot([int(L) for L in recall], [r["greedy"] for r in recall.values()], "kD:", lw=1.5, mfc="none",
                  label=f"shipped recipe, {next((w for w in training.split() if 'seed=' in w), training)}: greedy")
    if shipped.exists() and "fact_recall" in json.loads(shipped.read_text()):  # the shipped model: answer vs memory
        recall = json.loads(shipped.read_text())["fact_recall"]
        x = [int(L) for L in recall]
        R = json.loads((SHIPPED / "config.json").read_text())["hrr_dim"]
        left.plot(x, [r["greedy"] for r in recall.values()], "ks-", lw=2, label=f"shipped (70 min, R {R:,}): greedy")
        left.plot(x, [r["memory"] for r in recall.values()], "ks--", lw=1.5, mfc="none",
                  label="shipped: its memory's read alone")
    if grid.exists():
        for r in json.loads(grid.read_text())["rows"]:
            left.plot([int(L) for L in r["greedy"]], list(r["greedy"].values()), "x:", color="gray",
                      label=f"untrained surprise notebook, R {r['hrr_dim']:,}, s {r['read_scale']:g}")
    left.set_xscale("log", base=2)
    left.set_xlabel("document length (bytes)")
    left.set_ylabel("held-out greedy value-byte recall")
    left.set_ylim(0, 1)
    left.grid(alpha=0.3)
    figure.legend(*left.get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=7)
    right.set_xlabel("training minutes")
    right.set_ylabel("train bits/byte (batch)")
    right.set_ylim(1.5, 4)
    right.grid(alpha=0.3)
    figure.suptitle(f"fact laboratory ({command})", fontsize=8)
    figure.tight_layout(rect=(0, 0.17, 1, 1))  # the legend below both panels
    save_report(report, lines, rows, figure, "recall against length per arm, and training curves")


def main() -> None:
    from modeling_kathleen_notebook.experiments.lab_report import chosen_names, lab_parser

    parser = lab_parser(__doc__, DEFAULTS)
    parser.add_argument("--stage", type=int, choices=[1, 2], default=1, help="1: seed 42 of every arm; 2: seed 43")
    parser.add_argument("--arms", help="comma-separated arms (default: all of the spec)")
    parser.add_argument("--evaluate", metavar="RUN", help=argparse.SUPPRESS)  # one run, in its own process
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    if args.evaluate:
        evaluate_run(spec, Path(args.evaluate))
        return
    out = Path(args.out)
    arms = chosen_names("--arms", args.arms, list(spec["arms"]), args.spec)
    if not args.report_only:
        seeds = spec["seeds"][f"stage{args.stage}"]
        jobs = [(arm, seed) for arm in arms for seed in seeds]
        with ThreadPoolExecutor(args.parallel) as pool:
            for message in pool.map(lambda job: train_and_evaluate(args.spec, spec, out, *job), jobs):
                print(message, flush=True)
    write_report(spec, out, Path(args.report), "python scripts/fact_lab.py --report-only")
    print(f"wrote {args.report}.md, .png, .json")


if __name__ == "__main__":
    main()
