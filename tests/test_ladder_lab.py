"""The equal-budget ladder lab (issue 19) end to end on a tiny spec: the runs it plans, the configs it trains, the
report it writes, and the repeat probe that waits for its rung's trunk."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

import modeling_kathleen_notebook  # noqa: F401  registers the Auto classes
from modeling_kathleen_notebook.training.config import TrainingConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from ladder_lab import planned_runs, run_config  # noqa: E402

SPEC = json.loads((ROOT / "configuration" / "experiments" / "ladder.json").read_text())


def test_the_spec_plans_every_arm_on_the_most_data_and_the_ladder_arms_on_every_rung(tmp_path):
    runs = planned_runs(SPEC)
    most = max(SPEC["ladder"]["train_bytes"])
    assert [name for name, (_, size) in runs.items() if size == most] == [f"{arm}-5.18MB" for arm in SPEC["arms"]]
    assert {name for name in runs if name.endswith("-0.65MB")} == {"trunk-0.65MB", "notebook-0.65MB"}
    assert len(runs) == len(SPEC["arms"]) + len(SPEC["ladder"]["arms"]) * (len(SPEC["ladder"]["train_bytes"]) - 1)
    corpus = tmp_path / "corpus.txt"  # the spec's corpus lives outside the repository: any file stands in for it
    corpus.write_text("text")
    config = TrainingConfig.from_dict(run_config({**SPEC, "data": {**SPEC["data"], "corpus": str(corpus)}},
                                                 "notebook", 650000, tmp_path))
    assert config.train_data.byte_range == [0, 650000]
    assert config.train_data.byte_range[1] <= SPEC["data"]["validation"][0] < SPEC["data"]["test"][0]
    assert config.train.time_schedule and config.train.max_minutes == SPEC["train"]["max_minutes"]
    top = run_config(SPEC, "notebook", 5180771, tmp_path)
    assert top["data"]["train"]["byte_range"] != [0, 650000]  # control: the rung's slice is its own
    assert top["output_dir"] != str(tmp_path / "notebook-0.65MB")


def test_a_proportional_ladder_gives_each_rung_minutes_in_proportion_to_its_data(tmp_path):
    sizes, budget = SPEC["ladder"]["train_bytes"], SPEC["train"]["max_minutes"]
    proportional = {**SPEC, "ladder": {**SPEC["ladder"], "budget": "proportional"}}
    minutes = [run_config(proportional, "notebook", size, tmp_path)["train"]["max_minutes"] for size in sizes]
    assert minutes == pytest.approx([budget * size / max(sizes) for size in sizes]) and minutes[-1] == budget
    assert SPEC["train"]["max_minutes"] == budget  # the spec itself is left as it was
    # control: the default (and "equal") gives every rung the whole budget
    for spec in (SPEC, {**SPEC, "ladder": {**SPEC["ladder"], "budget": "equal"}}):
        assert {run_config(spec, "notebook", size, tmp_path)["train"]["max_minutes"] for size in sizes} == {budget}
    with pytest.raises(ValueError, match="proportional"):
        run_config({**SPEC, "ladder": {**SPEC["ladder"], "budget": "per epoch"}}, "notebook", sizes[0], tmp_path)
    spec = tmp_path / "spec.json"  # from the command line: one line naming the spec, and nothing written
    spec.write_text(json.dumps({**SPEC, "ladder": {**SPEC["ladder"], "budget": "per epoch"}}))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "ladder_lab.py"), "--spec", str(spec), "--out",
                           str(tmp_path / "runs")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f'{spec}: ladder.budget is "equal" or "proportional"' in done.stderr and not (tmp_path / "runs").exists()


def parameters(section: dict) -> int:
    from transformers import AutoModelForCausalLM

    from modeling_kathleen_notebook.training.config import model_config

    return sum(p.numel() for p in AutoModelForCausalLM.from_config(model_config(section)).parameters())


@pytest.mark.parametrize("arm", ["notebook", "llama", "mamba"])
def test_the_arms_are_parameter_matched_to_the_trunk(arm):
    trunk = parameters(SPEC["arms"]["trunk"])
    assert abs(parameters(SPEC["arms"][arm]) / trunk - 1) < 0.06, arm
    assert abs(parameters({"d_model": 96, "n_layers": 2, "memory": "none"}) / trunk - 1) > 0.06  # control: unmatched


def test_the_ladder_lab_trains_evaluates_probes_and_reports(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes((ROOT / "README.md").read_bytes()[:12000])  # real text, in every checkout
    spec = json.loads(json.dumps(SPEC))
    spec["data"] = {"corpus": str(corpus), "validation": [6000, 8000], "test": [8000, 12000]}
    spec["arms"] = {"trunk": {"d_model": 16, "n_layers": 1, "memory": "none"},
                    "notebook": {"d_model": 16, "n_layers": 1, "memory": "notebook", "hrr_dim": 256,
                                 "read_trust_bias_init": -1.0},
                    "llama": {"base_config": {"model_type": "llama", "vocab_size": 259, "hidden_size": 16,
                                              "intermediate_size": 32, "num_hidden_layers": 1,
                                              "num_attention_heads": 2}, "notebook_config": {"memory": "none"}}}
    spec["ladder"]["train_bytes"] = [3000, 6000]
    spec["train"].update(steps=4, batch_size=2, min_length=64, max_length=128, max_minutes=1, time_schedule=False,
                         eval_every=4, save_every=4, eval_windows=2, eval_length=128)
    spec["eval"] = {"window": 128, "probe_length": 256}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    command = [sys.executable, str(ROOT / "scripts" / "ladder_lab.py"), "--spec", str(tmp_path / "spec.json"),
               "--out", str(tmp_path / "runs"), "--report", str(tmp_path / "ladder")]

    def lab(*extra):
        done = subprocess.run([*command, *extra], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads((tmp_path / "ladder.json").read_text())

    # control first: the small rung's notebook without its trunk has no repeat probe yet
    early = lab("--runs", "notebook-0.003MB")
    assert set(early) == {"notebook-0.003MB"} and "repeat_probe" not in early["notebook-0.003MB"]
    assert "No run on 0.006 MB is in this report's output folder" in (tmp_path / "ladder.md").read_text()
    rows = lab()
    assert set(rows) == {"trunk-0.006MB", "notebook-0.006MB", "llama-0.006MB", "trunk-0.003MB", "notebook-0.003MB"}
    for name in ("notebook-0.003MB", "notebook-0.006MB"):  # the early run gets its probe once its trunk exists
        probe = rows[name]["repeat_probe"]["256"]
        assert set(probe["extra_repeat_gain"]) == {"all", "64-256", "256-1024", "1024-inf"}
        assert probe["extra_repeat_gain"] == pytest.approx(  # NaN where no repeat lies that far back
            {key: probe["repeat_gain"][key] - probe["trunk_repeat_gain"][key] for key in probe["repeat_gain"]},
            nan_ok=True)
    assert "repeat_probe" not in rows["trunk-0.003MB"] and "repeat_probe" not in rows["llama-0.006MB"]
    assert "test_bpb_stream" in rows["trunk-0.006MB"] and "test_bpb_stream" not in rows["llama-0.006MB"]
    assert all(0 < row["test_bpb"] < 12 and row["steps"] == 4 for row in rows.values())
    trust = rows["notebook-0.006MB"]["read_trust"]  # the trained trust, from its configured start
    assert len(trust["weights"]) == 6 and trust["weights"][0] != -4.0 and trust["noise_cap"] > 0
    assert rows["trunk-0.006MB"]["read_trust"] is None and rows["llama-0.006MB"]["read_trust"] is None  # control
    scalars = rows["notebook-0.006MB"]["notebook_scalars"]  # the trained scalars; none where no notebook is
    assert scalars["read_scale"] > 0 and scalars["forget_logit"] != -8.5 and 0 < scalars["forget_rate"] < 0.2
    assert rows["trunk-0.006MB"]["notebook_scalars"] == {} == rows["llama-0.006MB"]["notebook_scalars"]
    report = (tmp_path / "ladder.md").read_text()
    assert "No run on" not in report and "| arm | parameters | steps (minutes) |" in report  # control
    assert "| notebook-0.006MB | 0.313 | -1.00 -> " in report and "| trunk-0.006MB | " not in report.split(
        "## Read trust after training")[1].split("## Notebook scalars")[0]
    assert "| notebook | 0.003 | " in report.split("Own repeat gains")[1].split("## Read trust")[0]
    scalar_table = report.split("## Notebook scalars after training")[1].split("## Hypotheses")[0]
    assert "| notebook-0.006MB | " in scalar_table and " | -8.50 -> " in scalar_table
    assert "| trunk-0.006MB | " not in scalar_table
    assert scalar_table.index("| notebook-0.003MB | ") < scalar_table.index("| notebook-0.006MB | ")  # by rung
    assert "| llama |" in report and "| 0.003 |" in report and (tmp_path / "ladder.png").stat().st_size > 0
    (tmp_path / "ladder_discussion.md").write_text("What the runs say.\n")
    shutil.rmtree(tmp_path / "runs" / "llama-0.006MB")  # a run folder gone (a new machine): its row stays
    assert lab("--report-only") == rows
    report = (tmp_path / "ladder.md").read_text()
    assert "## Discussion\n\nWhat the runs say." in report
    # the report still names the two commands that trained the runs, then the --report-only one that rewrote it
    made_by = report.split("Runs trained and evaluated by: ")[1].split("\n")[0]
    trained, written = made_by.split(". Report written by: ")
    assert trained.count("ladder_lab.py") == 2 and "--runs notebook-0.003MB" in trained
    assert "--report-only" not in trained and "--report-only" in written
    assert (tmp_path / "runs" / "commands.txt").read_text().count("\n") == 2
    moved = tmp_path / "moved"  # control: a report rewritten from runs whose commands were not kept says so
    shutil.copytree(tmp_path / "runs", moved, ignore=shutil.ignore_patterns("commands.txt"))
    done = subprocess.run([*command[:-4], "--out", str(moved), "--report", str(tmp_path / "moved_report"),
                           "--report-only"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Runs trained and evaluated by: not recorded in {moved}." in (tmp_path / "moved_report.md").read_text()
    # a new machine: the runs folder gone, commands.txt with it; the report keeps the commands its last version named
    shutil.copy(tmp_path / "ladder.md", tmp_path / "gone_report.md")
    shutil.copy(tmp_path / "ladder.json", tmp_path / "gone_report.json")
    done = subprocess.run([*command[:-4], "--out", str(tmp_path / "gone"), "--report", str(tmp_path / "gone_report"),
                           "--report-only"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    kept = (tmp_path / "gone_report.md").read_text().split("Runs trained and evaluated by: ")[1].split("\n")[0]
    assert kept.split(". Report written by: ")[0] == trained and "not recorded" not in kept
    # one rung and no notebook to probe: the figure is the validation curves alone, a third of the width
    single = {**spec, "ladder": {"arms": ["trunk"], "baseline": "trunk", "train_bytes": [6000]}}
    (tmp_path / "single.json").write_text(json.dumps(single))
    done = subprocess.run([*command[:2], "--spec", str(tmp_path / "single.json"), "--out", str(tmp_path / "runs"),
                           "--report", str(tmp_path / "single"), "--report-only"], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    widths = {name: plt.imread(tmp_path / f"{name}.png").shape[1] for name in ("ladder", "single")}
    assert widths["single"] < widths["ladder"] / 2


def test_the_figure_caption_names_the_first_command_that_ran_this_reports_spec(tmp_path, monkeypatch):
    from modeling_kathleen_notebook.experiments.lab_report import provenance

    script = "scripts/ladder_lab.py"
    first = f"python {script} --spec configuration/experiments/a.json --out {tmp_path} --report reports/a"
    second = f"python {script} --spec=./configuration/experiments/b.json --out {tmp_path} --runs x --report reports/b"
    (tmp_path / "commands.txt").write_text(f"{first}\n{second}\n")
    for spec, caption in (("configuration/experiments/b.json", second), ("configuration/experiments/a.json", first)):
        monkeypatch.setattr(sys, "argv", [script, "--spec", spec, "--out", str(tmp_path), "--report-only"])
        line, figure_caption = provenance(tmp_path, report_only=True)
        assert figure_caption == caption  # a's caption is the log's first line, b's its second
        assert first in line and second in line  # the report's text names every command either way
    # a spec no recorded command ran: the caption is the command that writes the report
    monkeypatch.setattr(sys, "argv", [script, "--spec", "configuration/experiments/c.json", "--report-only"])
    assert provenance(tmp_path, report_only=True)[1].endswith("--spec configuration/experiments/c.json --report-only")
