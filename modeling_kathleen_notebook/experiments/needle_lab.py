"""The needle laboratory (SPEC §6.1, issue 5): train the four arms, test them zero-shot at longer lengths.

    kathleen-notebook needle [--quick] [--spec configuration/experiments/needle.json] [--out runs/needle]

Everything it does is read from the pre-registered experiment spec. Training runs are ordinary
`kathleen-notebook train` runs (two at a time, one thread each); evaluation is exact teacher-forced
value-byte accuracy on fresh haystacks, binned by needle-to-query distance (thirds of the length;
the far bin is the headline), read out three ways: full logits, memory only and trunk only.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..session import NotebookSession
from .needle import KEY_LENGTH, MARKER, VALUE_LENGTH, make_needle_example

BINS = ("near", "mid", "far")


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
            accuracy = (out.logits[0, 6:12].argmax(-1) == value).float().mean().item()
            (erased if f == victim else retained).append(accuracy)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"erased": mean(erased), "retained": mean(retained), "provenance": mean(provenance),
            "recalled_bytes": len(provenance)}


def arm_config(spec: dict, arm: str, seed: int, setting: dict, out: Path) -> dict:
    """A `kathleen-notebook train` config for one arm and seed of the lab."""
    arm_spec = dict(spec["arms"][arm])
    oracle = arm_spec.pop("oracle_gate", False)
    task = {k: v for k, v in spec["task"].items() if k in ("n_needles", "marker")}
    return {
        "model": {**spec["model"], **arm_spec},
        "data": {"train": {"needle": task}, "eval": {"needle": task}},
        "train": {**setting["train"], "seed": seed, "oracle_gate": oracle},
        "output_dir": str(out / f"{arm}-seed{seed}"),
    }


def train_arms(configs: list[dict], out: Path, parallel: int = 2) -> None:
    """Run the training configs as `kathleen-notebook train` subprocesses, `parallel` at a time."""
    pending, running = list(configs), []
    while pending or running:
        while pending and len(running) < parallel:
            config = pending.pop(0)
            if (Path(config["output_dir"]) / "final" / "model.safetensors").exists():
                continue  # already trained: the lab can be rerun to redo only the evaluation
            path = out / (Path(config["output_dir"]).name + ".json")
            path.write_text(json.dumps(config, indent=2))
            log = open(out / (Path(config["output_dir"]).name + ".log"), "w")
            command = [sys.executable, "-m", "modeling_kathleen_notebook.cli", "train", str(path)]
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
        print(f"  {arm} {folder.name} @ {length}: far {result['recall'][length]['full']['far']} "
              f"({time.perf_counter() - start:.0f}s)", flush=True)
    if notebook:
        result["unlearning"] = {length: unlearning_and_attribution(model, length, ev["unlearning_trials"], eval_seed,
                                                                    oracle) for length in ev["unlearning_lengths"]}
    return result


def run_lab(spec_path: str, setting_name: str, out: str, report: str, parallel: int = 2,
            command: str = "kathleen-notebook needle", report_only: bool = False) -> dict:
    """Train (or reuse) every arm and seed of the setting, evaluate them, write the report.
    report_only rewrites the report from the results.json of an earlier run."""
    spec = json.loads(Path(spec_path).read_text())
    setting = spec["settings"][setting_name]
    out_dir = Path(out) / setting_name
    if report_only:
        results = json.loads((out_dir / "results.json").read_text())
        write_report(spec, setting_name, results, Path(report), command.replace(" --report-only", ""), spec_path)
        return results
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = [arm_config(spec, arm, seed, setting, out_dir)
               for arm, seeds in setting["seeds"].items() for seed in seeds]
    started = time.perf_counter()
    train_arms(configs, out_dir, parallel)
    print(f"training done in {(time.perf_counter() - started) / 60:.1f} min", flush=True)
    results = {}
    for config in configs:
        arm = Path(config["output_dir"]).name.rsplit("-seed", 1)[0]
        results[Path(config["output_dir"]).name] = {
            "arm": arm, "seed": config["train"]["seed"],
            **evaluate_arm(Path(config["output_dir"]), arm, config["train"]["oracle_gate"], setting,
                           spec["eval_seed"]),
        }
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    write_report(spec, setting_name, results, Path(report), command, spec_path)
    return results


def write_report(spec: dict, setting_name: str, results: dict, report: Path, command: str, spec_path: str) -> None:
    """reports/needle.md and .png from the lab's results; with the spec's "summary_in", also a far-bin
    summary section in that other report (kept there when that report is regenerated)."""
    setting = spec["settings"][setting_name]
    train_length = setting["train"]["max_length"]
    for r in results.values():  # keys are ints in memory, strings after a JSON round trip
        r["recall"] = {int(n): rec for n, rec in r["recall"].items()}
        r["unlearning"] = {int(n): u for n, u in r.get("unlearning", {}).items()}
    lengths = sorted({length for r in results.values() for length in r["recall"]})

    def cell(value):
        return "-" if value is None else f"{value:.3f}"

    lines = [f"# {spec.get('title', 'Needle laboratory (SPEC §6.1)')}", "",
             f"Setting `{setting_name}` of the pre-registered spec `{spec_path}` "
             f"(registered {spec['registered']}). Trained at lengths {setting['train']['min_length']}-{train_length}, "
             f"{setting['train']['steps']} steps of batch {setting['train']['batch_size']}; evaluated on "
             f"{setting['eval']['haystacks']} fresh haystacks per length (1 needle, eval seed {spec['eval_seed']}), "
             "teacher-forced accuracy on the 6 value bytes; chance is 1/26.", "",
             "Regenerate (trains only what is missing, then evaluates; 1 thread per process):", "", "```",
             command, "```", "", "## Far bin (needle in the first third of the haystack), full logits", "",
             "| arm | seed | params | " + " | ".join(f"{n} ({n // train_length}x)" for n in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    for r in results.values():
        lines.append(f"| {r['arm']} | {r['seed']} | {r['parameters']:,} | " + " | ".join(
            cell(r["recall"][n]["full"]["far"]) if n in r["recall"] else "-" for n in lengths) + " |")
    lines += ["", "## Every bin and read-out (near / mid / far; memory-only and trunk-only logits)", "",
              "| arm | seed | length | full | memory only | trunk only | haystacks per bin |",
              "|---|---|---|---|---|---|---|"]
    for r in results.values():
        for n in lengths:
            if n in r["recall"]:
                rec = r["recall"][n]
                fmt = lambda d: " / ".join(cell(d[b]) for b in BINS)  # noqa: E731
                lines.append(f"| {r['arm']} | {r['seed']} | {n} | {fmt(rec['full'])} | {fmt(rec['memory'])} | "
                             f"{fmt(rec['trunk'])} | {'/'.join(str(rec['counts'][b]) for b in BINS)} |")
    if any(r.get("unlearning") for r in results.values()):
        lines += ["", "## Unlearning and attribution (5 facts, one erased, full-model recall)", "",
                  "| arm | seed | length | erased | retained | provenance | recalled bytes |",
                  "|---|---|---|---|---|---|---|"]
    for r in results.values():
        for n, u in r.get("unlearning", {}).items():
            lines.append(f"| {r['arm']} | {r['seed']} | {n} | {cell(u['erased'])} | {cell(u['retained'])} | "
                         f"{cell(u['provenance'])} | {u['recalled_bytes']} |")
    lines += ["", "## Hypotheses and targets (from the spec)", ""] + target_lines(results, train_length)
    discussion = report.with_name(report.stem + "_discussion.md")  # hand-written, kept across regenerations
    if discussion.exists():
        lines += ["", "## Discussion", "", discussion.read_text().strip()]
    report.parent.mkdir(parents=True, exist_ok=True)
    kept = summary_sections(report.read_text()) if report.exists() else []
    report.write_text("\n".join(lines + ([""] + kept if kept else [])) + "\n")
    if "summary_in" in spec:
        target = Path(spec["summary_in"])
        link = os.path.relpath(report, target.parent)
        insert_summary(target, report, summary_lines(spec, setting_name, results, train_length, link, command))
    plot(results, lengths, train_length, report.with_suffix(".png"))
    print(f"wrote {report} and {report.with_suffix('.png')}")


SUMMARY_BEGIN, SUMMARY_END = "<!-- summary of {} -->", "<!-- end of summary of {} -->"


def summary_lines(spec: dict, setting_name: str, results: dict, train_length: int, link: str,
                  command: str) -> list[str]:
    """A far-bin table of this lab (one row per arm and seed) for another report."""
    lengths = sorted({int(n) for r in results.values() for n in r["recall"]})
    lines = ["", f"## {spec['summary_title']}", "",
             f"From [{Path(link).name}]({link}) (setting `{setting_name}`, `{command}`): far-bin value-byte "
             "accuracy, full logits.", "",
             "| arm | seed | params | " + " | ".join(f"{n} ({n // train_length}x)" for n in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    for r in results.values():
        lines.append(f"| {r['arm']} | {r['seed']} | {r['parameters']:,} | " + " | ".join(
            "-" if far_at(r, n) is None else f"{far_at(r, n):.3f}" for n in lengths) + " |")
    return lines


def summary_sections(text: str) -> list[str]:
    """The summary sections other labs inserted into a report, to keep when it is rewritten."""
    kept, inside = [], False
    for line in text.splitlines():
        inside = inside or (line.startswith("<!-- summary of ") and not line.startswith("<!-- end"))
        if inside:
            kept.append(line)
        inside = inside and not line.startswith("<!-- end of summary of ")
    return kept


def insert_summary(target: Path, source: Path, lines: list[str]) -> None:
    """Replace (or append) the summary of `source` in `target`."""
    begin, end = SUMMARY_BEGIN.format(source.name), SUMMARY_END.format(source.name)
    text = target.read_text() if target.exists() else ""
    block = "\n".join([begin, *lines, end])
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    target.write_text(text)
    print(f"updated the summary of {source} in {target}")


def far_at(result: dict, length: int) -> float | None:
    """Far-bin full-logit accuracy at a length (keys are ints in memory, strings after JSON)."""
    recall = result["recall"].get(length, result["recall"].get(str(length)))
    return None if recall is None else recall["full"]["far"]


def hypothesis_lines(results: dict, train_length: int) -> list[str]:
    """H2-H4 of the spec, each with the measured values and whether the prediction held."""
    lines = []
    for r in results.values():
        far = {int(n): rec["full"]["far"] for n, rec in r["recall"].items() if rec["full"]["far"] is not None}
        if not far:
            continue
        if r["arm"] == "notebook-oracle":
            spread = max(far.values()) - min(far.values())
            lines.append(f"- H2 oracle gate, seed {r['seed']}: far bin {min(far.values()):.3f}-{max(far.values()):.3f} "
                         f"over {min(far)}-{max(far)} bytes, spread {spread:.3f} (predicted <= 0.05: "
                         f"{'held' if spread <= 0.05 else 'failed'})")
        if r["arm"] == "trunk":
            worst = max(far.values())
            lines.append(f"- H3 bare trunk, seed {r['seed']}: far bin at most {worst:.3f} (predicted < 0.15: "
                         f"{'held' if worst < 0.15 else 'failed'})")
        if r["arm"] == "attention" and train_length in far:
            inside = far[train_length]
            lines.append(f"- H4 attention head, seed {r['seed']}: far bin {inside:.3f} at the training length "
                         f"(predicted >= 0.90: {'held' if inside >= 0.90 else f'failed by {0.90 - inside:.3f}'}); "
                         f"{' / '.join(f'{far[n]:.3f}' for n in sorted(far))} at {' / '.join(map(str, sorted(far)))}")
    return lines + adapter_hypothesis_lines(results, train_length) + period_hypothesis_lines(results)


def adapter_hypothesis_lines(results: dict, train_length: int) -> list[str]:
    """A1-A3 of needle_adapter.json: notebook arms >= 0.90 at 1x/4x/8x; bare Mamba < 0.15 beyond 1x;
    bare transformer lower beyond 1x than at 1x."""
    lines = []
    for r in results.values():
        far = [far_at(r, k * train_length) for k in (1, 4, 8)]
        if None in far:
            continue
        shown = " / ".join(f"{f:.3f}" for f in far)
        if r["arm"].endswith("+notebook"):
            held = min(far) >= 0.90
            lines.append(f"- A1 {r['arm']}, seed {r['seed']}: far bin {shown} at 1x / 4x / 8x (predicted >= 0.90: "
                         f"{'held' if held else f'failed by {0.90 - min(far):.3f}'})")
        elif r["arm"] == "mamba":
            held = max(far[1:]) < 0.15
            lines.append(f"- A2 {r['arm']}, seed {r['seed']}: far bin {shown} (predicted < 0.15 at 4x and 8x: "
                         f"{'held' if held else 'failed'})")
        elif r["arm"] == "llama":
            held = max(far[1:]) < far[0]
            lines.append(f"- A3 {r['arm']}, seed {r['seed']}: far bin {shown} (predicted lower at 4x and 8x than "
                         f"at 1x: {'held' if held else 'failed'})")
    return lines


def period_hypothesis_lines(results: dict) -> list[str]:
    """P1 of needle_period.json: per seed, the learned notebook's far bin within 0.03 of the period-259 arm's."""
    lines = []
    for control in (r for r in results.values() if r["arm"] == "notebook-learned-period-259"):
        for r in (r for r in results.values() if r["arm"] == "notebook-learned" and r["seed"] == control["seed"]):
            lengths = sorted(n for n in r["recall"] if far_at(r, n) is not None and far_at(control, n) is not None)
            gaps = [far_at(r, n) - far_at(control, n) for n in lengths]
            worst = max(abs(g) for g in gaps)
            lines.append(f"- P1 seed {r['seed']}: far bin minus the period-259 arm's "
                         f"{' / '.join(f'{g:+.3f}' for g in gaps)} at {' / '.join(map(str, lengths))} (predicted "
                         f"within 0.03: {'held' if worst <= 0.03 else f'failed by {worst - 0.03:.3f}'})")
    return lines


def target_lines(results: dict, train_length: int) -> list[str]:
    """The issue's targets, each with the measured value and, if missed, by how much."""
    lines = hypothesis_lines(results, train_length)
    for r in results.values():
        if r["arm"] != "notebook-learned":
            continue
        four, sixteen = far_at(r, 4 * train_length), far_at(r, 16 * train_length)
        if four is not None:
            verdict = "met" if four >= 0.90 else f"missed by {0.90 - four:.3f}"
            lines.append(f"- H1 learned gate, seed {r['seed']}: far bin at 4x = {four:.3f} (target >= 0.90: {verdict})")
        if four is not None and sixteen is not None:
            drop = four - sixteen
            verdict = "met" if drop <= 0.05 else f"missed by {drop - 0.05:.3f}"
            lines.append(f"- H1 learned gate, seed {r['seed']}: 4x -> 16x drop = {drop:+.3f} "
                         f"(target <= 0.05: {verdict})")
        for n, u in r.get("unlearning", {}).items():
            met = [u["erased"] is not None and u["erased"] <= 0.10, u["retained"] is not None and u["retained"] >= 0.80,
                   u["provenance"] is not None and u["provenance"] >= 0.95]
            misses = [f"erased missed by {u['erased'] - 0.10:.3f}"] if not met[0] else []
            misses += [f"retained missed by {0.80 - u['retained']:.3f}"] if not met[1] else []
            misses += [f"provenance missed by {0.95 - u['provenance']:.3f}"] if not met[2] else []
            lines.append(f"- H5 learned gate, seed {r['seed']}, {n} bytes: erased {u['erased']:.3f}, retained "
                         f"{u['retained']:.3f}, provenance {u['provenance']:.3f} (targets <= 0.10 / >= 0.80 / >= 0.95: "
                         f"{'met' if all(met) else '; '.join(misses)})")
    return lines or ["- no learned-gate arm in this setting"]


def plot(results: dict, lengths: list[int], train_length: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2))
    for name, r in results.items():
        xs = [n for n in lengths if n in r["recall"]]
        axis.plot(xs, [r["recall"][n]["full"]["far"] for n in xs], "o-", label=name)
    axis.axvline(train_length, color="gray", linestyle=":", label="training length")
    axis.axhline(1 / 26, color="gray", linestyle="--", linewidth=0.8, label="chance")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("haystack length (bytes)")
    axis.set_ylabel("far-bin value-byte accuracy")
    axis.set_ylim(-0.02, 1.02)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
