"""The fact laboratory's report can be rewritten on a machine without its runs, from the rows it committed."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_fact_lab():
    spec = importlib.util.spec_from_file_location("fact_lab", ROOT / "scripts" / "fact_lab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_report_without_runs_comes_from_the_committed_rows(tmp_path):
    fact_lab = load_fact_lab()
    spec = json.loads((ROOT / "configuration" / "experiments" / "facts.json").read_text())
    shutil.copy(ROOT / "reports" / "facts.json", tmp_path / "facts.json")
    fact_lab.write_report(spec, tmp_path / "no-runs", tmp_path / "facts", "test")
    report = (tmp_path / "facts.md").read_text()
    for name in json.loads((ROOT / "reports" / "facts.json").read_text()):
        assert f"| {name} |" in report
    assert (tmp_path / "facts.png").stat().st_size > 0
    # control: without runs and without the rows there is nothing to report, and nothing is written
    (tmp_path / "facts.json").unlink()
    (tmp_path / "facts.md").unlink()
    with pytest.raises(SystemExit, match="nothing to report"):
        fact_lab.write_report(spec, tmp_path / "no-runs", tmp_path / "facts", "test")
    assert not (tmp_path / "facts.md").exists()


def test_a_run_on_this_machine_replaces_its_row_and_keeps_the_others(tmp_path):
    fact_lab = load_fact_lab()
    spec = json.loads((ROOT / "configuration" / "experiments" / "facts.json").read_text())
    rows = json.loads((ROOT / "reports" / "facts.json").read_text())
    shutil.copy(ROOT / "reports" / "facts.json", tmp_path / "facts.json")
    run = fact_lab.run_folder(tmp_path / "runs", "control", 42)
    run.mkdir(parents=True)
    (run / "eval.json").write_text(json.dumps({**rows["control (seed 42)"], "steps": 4321}))
    fact_lab.write_report(spec, tmp_path / "runs", tmp_path / "facts", "test")
    written = json.loads((tmp_path / "facts.json").read_text())
    assert written["control (seed 42)"]["steps"] == 4321  # control: the committed row had another step count
    assert rows["control (seed 42)"]["steps"] != 4321
    assert set(written) == set(rows)
    assert "| control (seed 42) | 4,321 |" in (tmp_path / "facts.md").read_text()


def test_other_trunk_seeds_of_the_shipped_recipe_get_a_row_each(tmp_path):
    fact_lab = load_fact_lab()
    spec = json.loads((ROOT / "configuration" / "experiments" / "facts.json").read_text())
    shutil.copy(ROOT / "reports" / "facts.json", tmp_path / "facts.json")
    fact_lab.write_report(spec, tmp_path / "no-runs", tmp_path / "facts", "test")
    assert "trunk seed by trunk seed" not in (tmp_path / "facts.md").read_text()  # control: no other seed, no table
    shipped = json.loads((fact_lab.SHIPPED / "measurements.json").read_text())
    other = {**shipped, "training_command": "kathleen-notebook train configuration/presets/demo-trunk.json "
             "train.seed=43", "test_bpb": 2.0123}
    del other["unlearning"]  # a part the record did not measure
    (tmp_path / "facts_recipe_seed43.json").write_text(json.dumps(other))
    fact_lab.write_report(spec, tmp_path / "no-runs", tmp_path / "facts", "test")
    table = (tmp_path / "facts.md").read_text().split("trunk seed by trunk seed")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == 2 and "train.seed=43" in rows[1] and "train.seed=43" not in rows[0]
    assert "| 2.0123 /" in rows[1] and rows[1].endswith("| - |")  # its own numbers; unlearning not measured


def test_a_lab_runs_the_names_it_is_given_and_refuses_others():
    from modeling_kathleen_notebook.experiments.lab_report import chosen_names

    known = ["trunk", "notebook", "llama"]
    assert chosen_names("--arms", "llama,trunk", known, "spec.json") == ["llama", "trunk"]
    assert chosen_names("--arms", None, known, "spec.json") == known  # none given: all of them
    with pytest.raises(SystemExit, match=r"--arms: \['mamba'\] are not in spec.json"):
        chosen_names("--arms", "trunk,mamba", known, "spec.json")
