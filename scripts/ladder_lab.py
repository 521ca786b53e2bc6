"""Equal-budget language modelling and a data-scaling mini-ladder on enwiki (issue 19): train every run of the
pre-registered spec for the same wall-clock budget, score each on the test split, probe the notebook against the
trunk of its rung, and write reports/ladder.{md,png,json}.

    python scripts/ladder_lab.py [--spec configuration/experiments/ladder.json] [--out runs/ladder]
        [--runs trunk-5.18MB,notebook-0.65MB] [--parallel 2]
    python scripts/ladder_lab.py --report-only

Runs: every arm on the largest slice of the train split (the equal-budget comparison), and the ladder's arms on
each smaller slice (run names: ARM-<megabytes>MB). Each trains as a `kathleen-notebook train` process
(needle_lab.train_arms), one thread, `parallel` at a time; a finished run is not trained again, an interrupted one
resumes from its newest checkpoint, an evaluated one is not evaluated again. Evaluation runs here, one thread: test
bits/byte in windows of the training length (every arm) and as one stream (the Kathleen arms), then the repeat probe
of each ladder arm against the baseline arm of its rung (SPEC §6.2's extra repeat gain and first-mention cost).

Budgets: every run gets train.max_minutes, or, with "budget": "proportional" in the spec's ladder section, each
rung that budget times its share of the largest rung's bytes (the largest rung's runs keep the full budget).
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import torch

from modeling_kathleen_notebook import KathleenConfig
from modeling_kathleen_notebook.experiments.lab_report import (
    chosen_names,
    discussion_lines,
    lab_parser,
    provenance,
    rows_from_runs,
    save_report,
)
from modeling_kathleen_notebook.experiments.needle_lab import train_arms
from modeling_kathleen_notebook.notebook import Notebook
from modeling_kathleen_notebook.read_trust import INITIAL_BIAS, ReadTrust

DEFAULTS = {"spec": "configuration/experiments/ladder.json", "out": "runs/ladder", "report": "reports/ladder"}
NOTEBOOK_SCALARS = ("read_scale", "forget_logit", "surprise_scale", "surprise_shift", "repeat_read_scale")
ZLIB = 2.770  # zlib -9 on the whole enwiki file, bits/byte (shared data README): L4's bar


def run_name(arm: str, train_bytes: int) -> str:
    return f"{arm}-{train_bytes / 1e6:.3g}MB"


def planned_runs(spec: dict) -> dict[str, tuple[str, int]]:
    """Run name -> (arm, train bytes): the equal-budget runs first (every arm on the most data), then the ladder's
    smaller rungs, smallest first."""
    most = max(spec["ladder"]["train_bytes"])
    runs = {run_name(arm, most): (arm, most) for arm in spec["arms"]}
    for size in sorted(spec["ladder"]["train_bytes"]):
        for arm in spec["ladder"]["arms"]:
            runs.setdefault(run_name(arm, size), (arm, size))
    return runs


def run_minutes(spec: dict, train_bytes: int) -> float:
    """A run's wall-clock budget: train.max_minutes for every run, or with the ladder's "budget": "proportional" that
    budget times the rung's share of the largest rung's bytes, so every rung reads its slice about as many times
    (compute grows with data, as in a scaling ladder) instead of the small slices being read over and over."""
    budget = spec["ladder"].get("budget", "equal")
    if budget not in ("equal", "proportional"):
        raise ValueError(f'ladder.budget is "equal" or "proportional", not {budget!r}')
    scale = train_bytes / max(spec["ladder"]["train_bytes"]) if budget == "proportional" else 1.0
    return spec["train"]["max_minutes"] * scale


def run_config(spec: dict, arm: str, train_bytes: int, out: Path) -> dict:
    """The `kathleen-notebook train` config of one run."""
    corpus = {"files": [spec["data"]["corpus"]], "format": "text"}
    return {"model": spec["arms"][arm],
            "data": {"train": {**corpus, "byte_range": [0, train_bytes]},
                     "eval": {**corpus, "byte_range": spec["data"]["validation"]}},
            "train": {**spec["train"], "max_minutes": run_minutes(spec, train_bytes)},
            "output_dir": str(out / run_name(arm, train_bytes))}


def test_ids(spec: dict) -> tuple[bytes, torch.Tensor]:
    from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

    start, end = spec["data"]["test"]
    text = Path(spec["data"]["corpus"]).read_bytes()[start:end]
    return text, bytes_to_ids(text)


def evaluate_run(spec: dict, folder: Path, arm: str, train_bytes: int) -> dict:
    """Test bits/byte of one trained run, its size, steps, bytes seen and validation curve."""
    from transformers import AutoModelForCausalLM

    from modeling_kathleen_notebook.scoring import bits_per_byte

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(folder / "final").eval()
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    _, ids = test_ids(spec)
    window = spec["eval"]["window"]
    result = {"arm": arm, "train_bytes": train_bytes, "parameters": sum(p.numel() for p in model.parameters()),
              "steps": metrics[-1]["step"], "train_minutes": metrics[-1]["minutes"],
              "curve": [(r["step"], r["minutes"], r["eval_bpb"]) for r in metrics if "eval_bpb" in r],
              "test_bpb": bits_per_byte(model, ids, window=window, progress=f"{folder.name}, windows of {window}")}
    if isinstance(model.config, KathleenConfig):  # a state of fixed size: the whole split as one stream
        result["test_bpb_stream"] = bits_per_byte(model, ids, progress=f"{folder.name}, one stream")
    print(folder.name, {k: v for k, v in result.items() if k != "curve"}, flush=True)
    return result


def probe_rung(spec: dict, out: Path, arm: str, train_bytes: int) -> dict:
    """The repeat probe of a ladder arm against the baseline arm trained on the same slice."""
    from transformers import AutoModelForCausalLM

    from modeling_kathleen_notebook.experiments.repeat_probe import probe_against_trunk

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(out / run_name(arm, train_bytes) / "final").eval()
    base = out / run_name(spec["ladder"]["baseline"], train_bytes) / "final"
    trunk = AutoModelForCausalLM.from_pretrained(base).eval()
    text, _ = test_ids(spec)
    with torch.no_grad():
        return probe_against_trunk(model, trunk, text, [spec["eval"]["probe_length"]])


def notebook_after_training(folder: Path) -> dict:
    """The trained read trust's parameters (θ, τ, c in nats; None for a model without one) and the notebook's
    scalars (those of NOTEBOOK_SCALARS it has, and its forget rate g; empty for a model without a notebook)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder / "final")
    trust = next((module for module in model.modules() if isinstance(module, ReadTrust)), None)
    notebook = next((module for module in model.modules() if isinstance(module, Notebook)), None)
    scalars = {} if notebook is None else {
        **{name: getattr(notebook, name).item() for name in NOTEBOOK_SCALARS if hasattr(notebook, name)},
        "forget_rate": notebook.forget_rate().item()}
    return {"read_trust": None if trust is None else {"weights": trust.weights.tolist(),
                                                      "threshold": trust.threshold.item(),
                                                      "noise_cap": trust.log_noise_cap.exp().item()},
            "notebook_scalars": scalars}


def evaluate_runs(spec: dict, out: Path, runs: dict[str, tuple[str, int]]) -> None:
    """eval.json for every trained run (every one with a final model, whichever invocation trained it) that lacks
    one; a ladder arm other than the baseline adds its repeat probe as soon as the baseline of its rung is
    trained, and a notebook its trained read trust and scalars."""
    ladder = spec["ladder"]
    for name, (arm, size) in runs.items():
        folder = out / name
        if not (folder / "final").exists():
            continue
        path = folder / "eval.json"
        result = json.loads(path.read_text()) if path.exists() else evaluate_run(spec, folder, arm, size)
        probed = arm in ladder["arms"] and arm != ladder["baseline"]
        if probed and "repeat_probe" not in result and (out / run_name(ladder["baseline"], size) / "final").exists():
            result["repeat_probe"] = probe_rung(spec, out, arm, size)
        if not {"read_trust", "notebook_scalars"} <= set(result):  # runs evaluated before either was recorded
            result |= notebook_after_training(folder)
        path.write_text(json.dumps(result, indent=1))


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def signed(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:+.3f}"  # NaN: no repeat that far back


def table_section(title: str, note: str, columns: list[str], rows: list[str]) -> list[str]:
    """A report section: its title, what its columns mean, and its table; nothing without rows (reports rewritten
    from runs recorded before the section existed)."""
    if not rows:
        return []
    return ["", f"## {title}", "", note, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *rows]


def read_trust_lines(spec: dict, rows: dict) -> list[str]:
    """Where each run's read trust started and ended: k = softplus(θ₀) at the start, θ₀ (the weight every position
    shares), τ and the cap c after training."""
    lines = []
    for name, row in rows.items():
        if not row.get("read_trust"):
            continue
        trust, start = row["read_trust"], spec["arms"][row["arm"]].get("read_trust_bias_init", INITIAL_BIAS)
        lines.append(f"| {name} | {math.log1p(math.exp(start)):.3f} | {start:+.2f} -> {trust['weights'][0]:+.3f} | "
                     f"{trust['threshold']:.3f} | {trust['noise_cap']:.4f} | "
                     f"{', '.join(f'{w:+.3f}' for w in trust['weights'][1:])} |")
    return table_section("Read trust after training",
                         "extra nats = k · relu(z - τ), k = softplus(θ · φ) (read_trust.py); θ₀ is the weight of the "
                         "constant feature, so softplus(θ₀) is k where every other feature is 0.",
                         ["run", "k at the start", "θ₀ start -> end", "τ end", "cap c end (nats)", "other weights end"],
                         lines)


def own_gain_lines(gains: dict, baseline: str) -> list[str]:
    """Each probed run's own repeat gain and its baseline's, whose difference is the extra repeat gain: which of the
    two moved from rung to rung. Nothing for probes recorded before the own gains were kept."""
    kept = [(arm, size, probe) for arm, by_size in gains.items() for size, probe in by_size.items()
            if "repeat_gain" in probe]
    if not kept:
        return []
    lines = ["", f"Own repeat gains (first - repeat, bits/byte; the extra repeat gain is the notebook's minus the "
             f"{baseline}'s):", "", f"| arm | train MB | own: all | >= 1,024 | {baseline}: all | >= 1,024 |",
             "|---|---|---|---|---|---|"]
    for arm, size, probe in kept:
        own, base = probe["repeat_gain"], probe["trunk_repeat_gain"]
        lines.append(f"| {arm} | {size / 1e6:.3g} | {signed(own['all'])} | {signed(own['1024-inf'])} | "
                     f"{signed(base['all'])} | {signed(base['1024-inf'])} |")
    return lines


def notebook_scalar_lines(spec: dict, rows: dict) -> list[str]:
    """Where each notebook run's scalars ended, with its forget logit's start: a learned forget rate drifts with
    training."""
    lines = []
    for name, row in rows.items():
        if not row.get("notebook_scalars"):
            continue
        scalars, arm = row["notebook_scalars"], spec["arms"][row["arm"]]
        start = arm.get("notebook_config", arm).get("forget_logit_init", KathleenConfig().forget_logit_init)
        surprise = (f"{scalars['surprise_scale']:.3f}, {scalars['surprise_shift']:.3f}"
                    if "surprise_scale" in scalars else "-")
        lines.append(f"| {name} | {scalars['read_scale']:.3f} | {start:+.2f} -> {scalars['forget_logit']:+.3f} | "
                     f"{scalars['forget_rate']:.2e} | {surprise} | {number(scalars.get('repeat_read_scale'))} |")
    return table_section("Notebook scalars after training",
                         "g = forget_max · sigmoid(forget logit) is the forget rate per unit of write strength (0 "
                         "without forgetting); a = surprise scale, c = surprise shift (β's logit gains a · (S - c)).",
                         ["run", "read scale", "forget logit start -> end", "g end", "a, c", "repeat read scale"],
                         lines)


def write_report(spec: dict, spec_path: str, rows: dict, report: Path, made_by: tuple[str, str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window, probe_length = spec["eval"]["window"], str(spec["eval"]["probe_length"])
    sizes = sorted(spec["ladder"]["train_bytes"])
    most, baseline = sizes[-1], spec["ladder"]["baseline"]
    minutes = [run_minutes(spec, size) for size in sizes]
    if len(set(minutes)) > 1:
        budget = ("Each rung's wall clock: " + " / ".join(f"{m:.3g}" for m in minutes) +
                  f" minutes at {' / '.join(f'{size / 1e6:.3g}' for size in sizes)} MB (proportional to its data)")
    else:
        budget = f"Every run: {minutes[0]:g} minutes of wall clock"
    probed = [arm for arm in spec["ladder"]["arms"] if arm != baseline]
    lines = [f"# {spec['title']}", "", f"Pre-registered spec: `{spec_path}` (registered {spec['registered']}). "
             f"{made_by[0]}.", "", f"Question: {spec['question']}", "",
             f"{budget} on one thread (cosine over the budget), seed "
             f"{spec['train']['seed']}, batch {spec['train']['batch_size']} of {spec['train']['min_length']}-"
             f"{spec['train']['max_length']} bytes. Test: the enwiki test split, exact, in windows of {window:,} "
             "bytes (every arm) and as one stream (the Kathleen arms); lower is better. zlib -9 on the whole file: "
             f"{ZLIB} bits/byte.", "",
             f"## Equal budget: every arm on {most / 1e6:.3g} MB", ""]
    equal = [row for row in rows.values() if row["train_bytes"] == most]
    if equal:
        lines += [f"| arm | parameters | steps (minutes) | test bpb, windows of {window:,} | test bpb, one stream | "
                  "validation bpb (last) |", "|---|---|---|---|---|---|"]
    else:  # a spec run for some rungs only (--runs): the largest rung's runs live in another output folder
        lines.append(f"No run on {most / 1e6:.3g} MB is in this report's output folder (it ran only other rungs).")
    for row in equal:
        lines.append(f"| {row['arm']} | {row['parameters']:,} | {row['steps']:,} ({row['train_minutes']:.0f}) | "
                     f"{row['test_bpb']:.4f} | {number(row.get('test_bpb_stream'))} | "
                     f"{number(row['curve'][-1][2] if row['curve'] else None)} |")
    lines += ["", f"## Ladder: {' and '.join(spec['ladder']['arms'])} against training data", "",
              f"Repeat probe (SPEC §6.2) in windows of {int(probe_length):,} bytes on the test split, each notebook "
              f"run against the {baseline} run of its rung: extra repeat gain = (first - repeat) with the notebook "
              f"- the same for the {baseline}, overall and per distance bin; first-mention cost = bpb on first "
              "mentions, notebook - trunk.", "",
              "| train MB | " + " | ".join(f"{arm} bpb (steps)" for arm in spec["ladder"]["arms"]) +
              "".join(f" | {arm}: extra repeat gain | 64-256 | 256-1,024 | >= 1,024 | first-mention cost"
                      for arm in probed) + " |",
              "|---|" + "---|" * (len(spec["ladder"]["arms"]) + 5 * len(probed))]
    gains = {arm: {} for arm in probed}  # arm -> train bytes -> its probe
    for size in sizes:
        cells = []
        for arm in spec["ladder"]["arms"]:
            row = rows.get(run_name(arm, size))
            cells.append("-" if row is None else f"{row['test_bpb']:.4f} ({row['steps']:,})")
        for arm in probed:
            probe = rows.get(run_name(arm, size), {}).get("repeat_probe", {}).get(probe_length)
            if probe:
                gains[arm][size] = probe
            gain = probe["extra_repeat_gain"] if probe else {}
            cells += [signed(gain.get(key)) for key in ("all", "64-256", "256-1024", "1024-inf")]
            cells.append(signed(probe["first_mention_cost"] if probe else None))
        lines.append(f"| {size / 1e6:.3g} | " + " | ".join(cells) + " |")
    lines += own_gain_lines(gains, baseline)
    lines += read_trust_lines(spec, rows) + notebook_scalar_lines(spec, rows)
    lines += ["", "## Hypotheses (as registered)", "", *[f"- {h}" for h in spec["hypotheses"]]]
    lines += discussion_lines(report)

    # the validation curves always; the data panel with more than one rung, the gain panel with a notebook to probe
    # and the own gains' panel when the probes kept them
    own_gains = any("repeat_gain" in probe for by_size in gains.values() for probe in by_size.values())
    panels = ["curves"] + ["data"] * (len(sizes) > 1) + ["gain"] * bool(probed) + ["own"] * own_gains
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.6), squeeze=False)
    axis = dict(zip(panels, axes[0]))
    color = {arm: f"C{i}" for i, arm in enumerate(spec["arms"])}  # one colour per arm in every panel
    for row in equal:
        axis["curves"].plot([c[1] for c in row["curve"]], [c[2] for c in row["curve"]], "o-", color=color[row["arm"]],
                            label=f"{row['arm']} ({row['steps']:,} steps)")
    axis["curves"].set_xlabel("training minutes")
    axis["curves"].set_ylabel("validation bits/byte")
    axis["curves"].set_title(f"equal budget, {most / 1e6:.3g} MB", fontsize=9)
    if not equal:
        axis["curves"].text(0.5, 0.5, "no run on this rung\nin this output folder", ha="center", va="center",
                            transform=axis["curves"].transAxes, color="0.4")
    if "data" in axis:
        for arm in spec["ladder"]["arms"]:
            points = [(size / 1e6, rows[run_name(arm, size)]["test_bpb"]) for size in sizes
                      if run_name(arm, size) in rows]
            if points:
                axis["data"].plot(*zip(*points), "o-", color=color[arm], label=arm)
        axis["data"].set_ylabel(f"test bits/byte (windows of {window})")
    if "gain" in axis:
        for arm, by_size in gains.items():
            if by_size:
                axis["gain"].plot([size / 1e6 for size in by_size],
                                  [g["extra_repeat_gain"]["all"] for g in by_size.values()], "o-", color=color[arm],
                                  label=f"{arm}: all repeats")
                axis["gain"].plot([size / 1e6 for size in by_size],
                                  [g["extra_repeat_gain"]["1024-inf"] for g in by_size.values()], "s--",
                                  color=color[arm], alpha=0.6, label=f"{arm}: >= 1,024 bytes back")
        axis["gain"].set_ylabel(f"extra repeat gain at {int(probe_length):,} bytes (bits/byte)")
    if "own" in axis:  # the extra gain is the difference of these two: which one moved along the ladder
        for arm, by_size in gains.items():
            kept = {size / 1e6: probe for size, probe in by_size.items() if "repeat_gain" in probe}
            axis["own"].plot(list(kept), [p["repeat_gain"]["all"] for p in kept.values()], "o-", color=color[arm],
                             label=arm)
            axis["own"].plot(list(kept), [p["trunk_repeat_gain"]["all"] for p in kept.values()], "o--",
                             color=color[baseline], label=f"{baseline} (against {arm})")
        axis["own"].set_ylabel(f"own repeat gain at {int(probe_length):,} bytes, all repeats (bits/byte)")
    for name in ("data", "gain", "own"):
        if name in axis:
            axis[name].set_xscale("log")
            axis[name].set_xlabel("training data (MB)")
            axis[name].set_xticks([size / 1e6 for size in sizes], [f"{size / 1e6:.3g}" for size in sizes])
            axis[name].minorticks_off()
    for panel in axis.values():
        panel.grid(alpha=0.3)
        if panel.get_legend_handles_labels()[0]:
            panel.legend(fontsize=8)
    title = f"Equal budget and data ladder ({made_by[1]})"
    figure.suptitle(textwrap.fill(title, 80 * len(panels)), fontsize=8)  # about 80 characters fit a panel
    figure.tight_layout()
    save_report(report, lines, rows, figure, "validation curves, bits/byte and repeat gain against data")


def main() -> None:
    parser = lab_parser(__doc__, DEFAULTS)
    parser.add_argument("--runs", help="comma-separated run names (default: all the spec plans)")
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    runs = planned_runs(spec)
    chosen = chosen_names("--runs", args.runs, list(runs), args.spec)
    out = Path(args.out)
    try:  # a spec's mistakes stop the lab before anything is written
        configs = [run_config(spec, *runs[name], out) for name in chosen]
    except ValueError as error:
        raise SystemExit(f"{args.spec}: {error}") from None
    made_by = provenance(out, args.report_only, Path(args.report))
    if not args.report_only:
        train_arms(configs, out, args.parallel)
        evaluate_runs(spec, out, runs)
    report = Path(args.report)
    rows = rows_from_runs({name: out / name / "eval.json" for name in runs}, report)
    rows = dict(sorted(rows.items(), key=lambda item: item[1]["train_bytes"]))  # by rung, each in the plan's order
    report.parent.mkdir(parents=True, exist_ok=True)
    write_report(spec, args.spec, rows, report, made_by)
    print(f"wrote {report}.md, .png, .json")


if __name__ == "__main__":
    main()
