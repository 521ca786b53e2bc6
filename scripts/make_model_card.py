"""Fill model_cards/template.md with measured figures and write it as the checkpoint's README.md.

    python scripts/make_model_card.py CHECKPOINT --results CHECKPOINT/measurements.json \
        [--repo-id kathleen-notebook/kathleen-notebook-0.5m] [--name ...]

The figures come from `scripts/measure_checkpoint.py` (its JSON); training facts from the run's
config.json and metrics.jsonl next to `final/`, if given with --run (they are then kept in CHECKPOINT/training.json,
which travels with the checkpoint through resize_memory.py and fit_read_trust.py and is read when --run is not
given); the resize command from CHECKPOINT/resize.json when `scripts/resize_memory.py` made the checkpoint. A
placeholder left unfilled is an error.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM, __version__

TEMPLATE = Path(__file__).resolve().parents[1] / "model_cards" / "template.md"


def fill(template: str, values: dict) -> str:
    text = re.sub(r"\{\{(\w+)\}\}", lambda m: str(values.get(m.group(1), m.group(0))), template)
    missing = sorted(set(re.findall(r"\{\{(\w+)\}\}", text)))
    if missing:
        raise SystemExit(f"model card placeholders left unfilled: {missing}")
    return text


def after_training(resize: dict, trust_command: str | None) -> tuple[str, list[str], str | None, list[str]]:
    """(the first resize, the steps between it and the last fit of the read trust, that fit, what came after it)
    from a checkpoint's resize.json record and its read_trust.json command (None without one). A model resized
    again after its trust was fitted keeps the earlier commands in resize.json (scripts/resize_memory.py), oldest
    first."""
    chain = [*resize.get("earlier_commands", []), resize["command"]] if resize else []
    if trust_command is not None or not any("fit_read_trust" in c for c in chain):
        return (chain[0] if chain else "(not resized)"), chain[1:], trust_command, []
    fit = max(i for i, c in enumerate(chain) if "fit_read_trust" in c)
    return chain[0], chain[1:fit], chain[fit], chain[fit + 1:]


def read_trust_fit(checkpoint: Path, resize: dict) -> tuple[dict, str | None]:
    """(the record of the read trust's fit, its command if the fit was this checkpoint's last step, else None).
    A model resized after the fit has no read_trust.json of its own; its resize.json keeps the record."""
    trust_path = checkpoint / "read_trust.json"
    if trust_path.exists():
        trust = json.loads(trust_path.read_text())
        return trust, trust["command"]
    return resize.get("read_trust") or {}, None


def memory_sentence(resize: dict, resize_command: str) -> str:
    """How the trained model got the memory it ships with: a notebook resized after training beside the trunk, or
    one attached to a trunk trained alone (resize.json says which)."""
    if resize.get("attached_to_bare_trunk"):
        return (f"given its notebook by `{resize_command}`: the trunk and byte head unchanged, no notebook weight "
                "trained with them; R, the surprise rule, the forget rate and the read scale are set there "
                "(resize.json, reports/facts.md).")
    return (f"given its larger memory by `{resize_command}` (nothing trained depends on R; its read scale, surprise "
            "rule and forget rate were chosen on training-part facts in the validation slice: resize.json, "
            "reports/facts.md).")


def training_record(run: Path) -> dict:
    """What the card says about training, from a run folder: its config.json and last metrics.jsonl row."""
    config = json.loads((run / "config.json").read_text())
    train = config["train"]
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    return {"training_steps": last["step"], "batch_size": train["batch_size"], "min_length": train["min_length"],
            "max_length": train["max_length"], "seed": train["seed"], "training_minutes": f"{last['minutes']:.0f}",
            "trained_hrr_dim": config["model"].get("hrr_dim", KathleenConfig().hrr_dim)}


def key_limitation(key_window: int, repeat_window: int, hrr_dim: int) -> str:
    """What the keys' lengths mean for recall: a long key needs the query to restate it; a repeat bank's short one
    finds what the long one misses but is shared by every fact that ends alike."""
    long_key = (f"A key is the last {key_window} bytes before a position: a fact is recalled when the query restates "
                "at least those bytes as they were read")
    if not repeat_window:
        return (f"{long_key}, so a query that shares fewer with the fact (the SPEC §6.1 needles, whose context is 7 "
                f"bytes) is not recalled; `python scripts/resize_memory.py MODEL OUT --hrr-dim {hrr_dim} "
                "--key-window 7` re-keys it (every weight kept).")
    return (f"{long_key}; the repeat bank's keys of the last {repeat_window} bytes find what the long ones miss (a "
            "repeat in another context, the SPEC §6.1 needles), but they are shared by every fact whose question "
            f"ends in the same {repeat_window} bytes: after a fact is unlearned, its question can be answered with "
            "another fact's value through the short key, unless unlearning also clears what the other sentences "
            "wrote under its short keys (`NotebookSession.unlearn(..., clear_shared_keys=True)`), which costs the "
            "other facts part of their recall (reports/unlearn_hazard.md).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--results", required=True)
    parser.add_argument("--run", help="the training output_dir (config.json, metrics.jsonl); default: "
                        "CHECKPOINT/training.json")
    parser.add_argument("--repo-id", default="kathleen-notebook/kathleen-notebook-0.5m")
    parser.add_argument("--name", default="kathleen-notebook-0.5m")
    parser.add_argument("--out", help="default: CHECKPOINT/README.md")
    args = parser.parse_args()
    model = KathleenForCausalLM.from_pretrained(args.checkpoint)
    config = model.config
    results = json.loads(Path(args.results).read_text())
    notebook = sum(p.numel() for p in model.model.memory.parameters()) if model.model.memory is not None else 0
    resize_path = Path(args.checkpoint) / "resize.json"
    resize = json.loads(resize_path.read_text()) if resize_path.exists() else {}
    trust, trust_command = read_trust_fit(Path(args.checkpoint), resize)
    trust_record = "read_trust.json" if trust_command else "its record is resize.json's read_trust"
    # six weights and a threshold, and the crosstalk cap when --noise-cap fitted it (otherwise it never binds)
    trust_numbers = 8 if trust.get("noise_cap") is not None else 7
    own_trust = config.memory == "notebook" and config.repeat_read_trust  # the repeat bank's: as many numbers again
    trust_numbers *= 2 if own_trust else 1
    resize_command, between, trust_command, later = after_training(resize, trust_command)
    repeat_window = config.repeat_key_window if config.memory == "notebook" else 0
    fitted_scale = " and the repeat bank's read scale" if repeat_window and trust.get("repeat_read_scale") is not None \
        and "--keep-repeat-read-scale" not in (trust_command or "") else ""
    unlearning = results.get("unlearning", {})
    probe = results.get("repeat_probe", {})
    values = {
        "name": args.name, "repo_id": args.repo_id, "package_version": __version__,
        "key_binding": {"bind": "bound", "bundle": "bundled"}[config.key_binding],
        "write_signal": {"gate": "a learned gate", "surprise": "the trunk's surprise",
                         "gate+surprise": "a learned gate and the trunk's surprise"}[config.write_signal],
        "read_scale": f"{float(model.model.memory.read_scale.detach()):.1f}" if model.model.memory is not None else "-",
        "memory_sentence": memory_sentence(resize, resize_command),
        "between_sentence": "".join(f" Then `{c}` (resize.json)." for c in between),
        "later_sentence": "".join(f" Then `{c}` (every trained weight carried over: resize.json)." for c in later),
        "repeat_bank": "" if not repeat_window else (
            f", and a repeat bank of the same R keyed by the newest {repeat_window} bytes (read scale "
            f"{float(model.model.memory.repeat_read_scale.detach()):.2f}"
            + (", its read through a read trust of its own)" if own_trust else ")")),
        "key_limitation": key_limitation(config.key_window, repeat_window, config.hrr_dim),
        "read_trust_sentence": "" if trust_command is None else (
            f" Its read trust was then fitted by `{trust_command}` ({trust_numbers} numbers{fitted_scale}, everything "
            "else frozen, "
            "on training-part names and value alphabets in sentence shapes of random words: "
            f"{trust_record})."),
        "other_commands": "".join(
            f"; {what} by `{results[key]}`" for key, what in (
                ("trunk_command", "the bare trunk's figures and the repeat probe"),
                ("facts_command", "fact recall (taken from its record by --facts-from)")) if key in results),
        "measure_seed": results.get("seed", "-"),
        "unlearn_before": unlearning.get("erased_before"), "unlearn_after": unlearning.get("erased_after"),
        "unlearn_trunk_only": unlearning.get("erased_trunk_only"), "kept_before": unlearning.get("kept_before"),
        "kept_after": unlearning.get("kept_after"),
        "parameters": f"{sum(p.numel() for p in model.parameters()):,}",
        "trunk_parameters": f"{sum(p.numel() for p in model.parameters()) - notebook:,}",
        "notebook_parameters": f"{notebook:,}", "d_model": config.d_model, "n_layers": config.n_layers,
        "hrr_dim": config.hrr_dim, "key_window": config.key_window, "value_codebook": config.value_codebook,
        "forgetting": "on" if config.forgetting else "off", "read_trust": "on" if config.read_trust else "off",
        "threads": 1,  # measurements from before measure_checkpoint.py recorded its threads
        **results,
        "bpb_bytes": f"{results.get('bpb_bytes', 608_975):,}",  # after **results: its raw int is not for print
    }
    if "fact_recall" in results:
        values["memory_recall"] = " / ".join(f"{r['memory']:.4f}" for r in results["fact_recall"].values())
    for length in ("2048", "4096"):
        if length not in probe:  # no trunk checkpoint was at hand when it was measured: say so, not a number
            values[f"repeat_gain_{length}"] = "not measured (`measure_checkpoint.py --trunk-only --trunk TRUNK`)"
            values[f"first_cost_{length}"] = "not measured"
        else:
            values[f"repeat_gain_{length}"] = " / ".join(
                f"{probe[length]['extra_repeat_gain'][k]:+.3f}" for k in ("all", "64-256", "256-1024", "1024-inf"))
            values[f"first_cost_{length}"] = f"{probe[length]['first_mention_cost']:+.4f}"
    record_path = Path(args.checkpoint) / "training.json"
    if args.run:
        record_path.write_text(json.dumps(training_record(Path(args.run)), indent=1))
    if record_path.exists():
        values.update(json.loads(record_path.read_text()))
    values["trained_with"] = ("attached after training" if resize.get("attached_to_bare_trunk")
                              else f"trained at R = {values.get('trained_hrr_dim', config.hrr_dim)}")
    out = Path(args.out or Path(args.checkpoint) / "README.md")
    out.write_text(fill(TEMPLATE.read_text(), {k: (f"{v:.4f}" if isinstance(v, float) else v)
                                               for k, v in values.items()}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
