"""Give a trained checkpoint a larger (or smaller) notebook, and optionally calibrate how it writes and reads there.

    python scripts/resize_memory.py runs/demo/final runs/demo/final-R32768 --hrr-dim 32768 \
        [--forgetting] [--calibrate --scales 4,8 --shifts 0,1 --surprise-scales 1 --forget-logits=-6,-5 --documents 4]
    python scripts/resize_memory.py runs/demo-trunk/final runs/attached --hrr-dim 65536 --set read_scale=4 ...
    python scripts/resize_memory.py CHECKPOINT OUT --hrr-dim R --noise-cap 0.03   (the read trust's cap, in nats)
    python scripts/resize_memory.py CHECKPOINT OUT --hrr-dim R --repeat-key-window 4   (a repeat bank beside it)

A bare trunk (memory "none") gets a notebook of today's defaults (KathleenConfig's key, write rule and read):
its trunk and byte head are copied unchanged, the notebook's scalars start at the config's initial values and
are set with --set or --calibrate. Its trunk logits are then exactly the bare trunk's, so whatever the memory
adds or costs is the read's alone (a trunk trained beside a memory learns to lean on it: reports/facts.md).

Nothing trained depends on R: the gate or surprise scale and shift, the read scale and the forget rate act on
numbers (β, hits, keep factors) whose meaning does not change with R, while the codebooks are fixed random tables
drawn from the config's key_seed. A larger R only lowers the crosstalk of many writes (noise σ² ≈ Σβ² / R), so a
model trained at a small R, where training is cheap, can read and write a large memory. --forgetting switches
write-triggered forgetting on (a model trained without it then starts from the config's forget_logit_init).

--calibrate then tries every combination of the read scale s (the trained s and --scales), for surprise writes the
shift c (trained c plus each of --shifts) and scale a (trained a and --surprise-scales), and with forgetting the
forget logit (trained and --forget-logits). Each is scored by greedy recall of facts from facts.py's *training*
part planted in the enwiki validation slice (never the held-out part or the test split) and by validation
bits/byte: in windows of 2,048 over the first --bpb-bytes, and as one stream over the first --stream-bytes (a
memory that fills up without forgetting shows there). The choice: the best recall among the settings whose two
bits/byte are both within 0.01 of the trained setting's windows, ties toward the trained setting. Seeds: documents
from --seed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shlex
import shutil
import sys
from pathlib import Path

import torch

from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
from modeling_kathleen_notebook.codebooks import make_codebooks
from modeling_kathleen_notebook.experiments.fact_recall import evaluate_fact_recall
from modeling_kathleen_notebook.scoring import bits_per_byte
from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

VALIDATION = (5_180_771, 5_480_771)  # the last 300,000 bytes of the enwiki train split (shared data README)
# the notebook's scalar parameters
KNOBS = ("read_scale", "surprise_shift", "surprise_scale", "forget_logit", "repeat_read_scale")
# the config fields that describe the notebook (KathleenConfig's "Memory" settings): a bare trunk's config carries
# them too, at whatever the defaults were when it was saved, so an attached notebook takes today's instead
NOTEBOOK_FIELDS = ("key_window", "key_binding", "write_signal", "surprise_scale_init", "surprise_shift_init",
                   "gate_window", "gate_embed_dim", "gate_bias_init", "read_scale_init", "read_trust",
                   "read_noise_cap_init", "fft_norm",
                   "value_codebook", "fourier_period", "forgetting", "forget_logit_init", "forget_max",
                   "learn_forget_rate", "keep_clamp",
                   "scan_chunk", "key_seed")


def set_noise_cap(memory: torch.nn.Module, nats: float) -> None:
    """--noise-cap: the read trust's cap c on the crosstalk the linear read passes (read_trust.py), in nats."""
    if memory.trust is None:
        raise ValueError("this model's notebook has no read trust (resize without --drop-trust, or train with one)")
    if not 0.0 < nats < math.inf:
        raise ValueError(f"the cap must be a positive number of nats, got {nats}")
    with torch.no_grad():
        memory.trust.log_noise_cap.fill_(math.log(nats))


def resized(model: KathleenForCausalLM, hrr_dim: int, forgetting: bool | None = None,
            drop_trust: bool = False, key_window: int | None = None,
            repeat_key_window: int | None = None) -> KathleenForCausalLM:
    """The same model with a notebook of R = hrr_dim (and forgetting switched, keys over another number of bytes,
    a repeat bank keyed by the newest repeat_key_window bytes (0: none), if given): every trained weight copied, the
    codebooks drawn anew from the config's key_seed at the new size. drop_trust leaves out the read trust, which was
    fitted to the old R's crosstalk (scripts/fit_read_trust.py fits a new one), and a repeat bank's own trust with it
(or with the repeat bank). A bare trunk (memory "none") gets a
    new notebook of today's default settings (NOTEBOOK_FIELDS), its scalars at their initial values. A repeat bank
    the model did not have reads at the first memory's read scale."""
    if model.config.memory not in ("notebook", "none"):
        raise ValueError(f"only a notebook or a bare trunk can be given a notebook, not memory={model.config.memory!r}")
    attach = model.config.memory == "none"
    settings = model.config.to_dict()
    if attach:
        defaults = KathleenConfig()
        settings |= {name: getattr(defaults, name) for name in NOTEBOOK_FIELDS}
    forgetting = settings["forgetting"] if forgetting is None else forgetting
    read_trust = settings["read_trust"] and not drop_trust
    key_window = settings["key_window"] if key_window is None else key_window
    repeat_key_window = settings.get("repeat_key_window", 0) if repeat_key_window is None else repeat_key_window
    repeat_read_trust = bool(settings.get("repeat_read_trust")) and read_trust and bool(repeat_key_window)
    config = KathleenConfig(**{**settings, "memory": "notebook", "hrr_dim": hrr_dim, "forgetting": forgetting,
                               "read_trust": read_trust, "key_window": key_window,
                               "repeat_key_window": repeat_key_window, "repeat_read_trust": repeat_read_trust})
    bigger = KathleenForCausalLM(config).eval()
    codebooks = {f"model.memory.{name}" for name in make_codebooks(config)}
    new = {k for k in bigger.state_dict() if k.startswith("model.memory.")} if attach else codebooks
    dropped = tuple(prefix for prefix, kept in (("model.memory.trust.", read_trust),
                                                ("model.memory.repeat_trust.", repeat_read_trust)) if not kept)
    weights = {k: v for k, v in model.state_dict().items() if k not in codebooks and not k.startswith(dropped)}
    if not repeat_key_window:
        weights.pop("model.memory.repeat_read_scale", None)
    elif "model.memory.read_scale" in weights:  # a repeat bank it did not have reads as loud as its first memory
        weights.setdefault("model.memory.repeat_read_scale", weights["model.memory.read_scale"])
    missing, unexpected = bigger.load_state_dict(weights, strict=False)
    if set(missing) - new or unexpected:
        raise ValueError(f"resizing could not carry over {sorted(set(missing) - new)} {sorted(unexpected)}")
    return bigger


def earlier_commands(checkpoint: Path) -> list[str]:
    """How the checkpoint came to be after training, oldest first: its own resize.json's history and command,
    then its read trust's fit (read_trust.json), so a model resized twice keeps the whole chain for its card."""
    commands = []
    if (checkpoint / "resize.json").exists():
        resize = json.loads((checkpoint / "resize.json").read_text())
        commands += [*resize.get("earlier_commands", []), resize["command"]]
    if (checkpoint / "read_trust.json").exists():
        commands.append(json.loads((checkpoint / "read_trust.json").read_text())["command"])
    return commands


def read_trust_record(checkpoint: Path) -> dict | None:
    """The fit of the read trust the model carries (its command and numbers, for the card): the checkpoint's
    read_trust.json, or the record an earlier resize kept of it; None for a model whose trust was never fitted."""
    if (checkpoint / "read_trust.json").exists():
        return json.loads((checkpoint / "read_trust.json").read_text())
    if (checkpoint / "resize.json").exists():
        return json.loads((checkpoint / "resize.json").read_text()).get("read_trust")
    return None


def attached_to_bare_trunk(checkpoint: Path, model: KathleenForCausalLM) -> bool:
    """Whether the model's notebook was attached to a trunk trained alone: this resize gives a bare trunk one, or
    the checkpoint is such a model already (its resize.json says so), resized again."""
    if model.config.memory == "none":
        return True
    resize = checkpoint / "resize.json"
    return resize.exists() and bool(json.loads(resize.read_text()).get("attached_to_bare_trunk"))


def candidates(memory: torch.nn.Module, args: argparse.Namespace, uses_surprise: bool, forgetting: bool) -> list:
    """Every combination of the knobs to try, the trained setting first."""
    trained = {k: float(getattr(memory, k).detach()) for k in KNOBS if hasattr(memory, k)}
    grid = {"read_scale": [trained["read_scale"], *map(float, args.scales.split(","))]}
    if uses_surprise:
        grid["surprise_shift"] = [trained["surprise_shift"] + float(d) for d in args.shifts.split(",")]
        grid["surprise_scale"] = [trained["surprise_scale"], *map(float, filter(None, args.surprise_scales.split(",")))]
    if forgetting:
        grid["forget_logit"] = [trained["forget_logit"], *map(float, filter(None, args.forget_logits.split(",")))]
    settings = [dict(zip(grid, values)) for values in itertools.product(*(dict.fromkeys(v) for v in grid.values()))]
    first = {k: trained[k] for k in grid}
    return [first] + [s for s in settings if s != first]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--hrr-dim", type=int, required=True, help="the new R (even)")
    parser.add_argument("--forgetting", action="store_true", help="switch write-triggered forgetting on")
    parser.add_argument("--key-window", type=int, default=None,
                        help="bytes per key (default: the checkpoint's); a longer window keeps facts that share a "
                             "sentence shape, or whose prompt ends in common words, apart")
    parser.add_argument("--repeat-key-window", type=int, default=None,
                        help="give the notebook a repeat bank keyed by this many newest bytes, fewer than the key "
                             "window (0: none; default: the checkpoint's); it reads at the first memory's scale")
    parser.add_argument("--drop-trust", action="store_true",
                        help="leave out the read trust (e.g. resizing a shipped checkpoint whose trust fits its R)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KNOB=VALUE",
                        help=f"fix knobs instead of calibrating them, e.g. read_scale=4 (knobs: {', '.join(KNOBS)})")
    parser.add_argument("--noise-cap", type=float, metavar="NATS",
                        help="set the read trust's cap on the crosstalk its linear read passes (e.g. 0.03)")
    parser.add_argument("--calibrate", action="store_true", help="choose the knobs below on training-part facts")
    parser.add_argument("--scales", default="4,8,16", help="read scales to try")
    parser.add_argument("--shifts", default="0", help="with surprise writes: added to the trained shift c (nats)")
    parser.add_argument("--surprise-scales", default="", help="with surprise writes: scales a to try (per nat)")
    parser.add_argument("--forget-logits", default="", help="with forgetting: forget logits to try")
    parser.add_argument("--lengths", default="2048,8192", help="fact-document lengths of the calibration")
    parser.add_argument("--documents", type=int, default=4, help="calibration documents per length")
    parser.add_argument("--bpb-bytes", type=int, default=50_000, help="validation bytes scored in windows")
    parser.add_argument("--stream-bytes", type=int, default=60_000, help="validation bytes scored as one stream")
    parser.add_argument("--seed", type=int, default=500)
    parser.add_argument("--data", default="../shared/data/enwiki_excerpt.xml")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = KathleenForCausalLM.from_pretrained(args.checkpoint).eval()
    attached = attached_to_bare_trunk(Path(args.checkpoint), model)
    try:
        model = resized(model, args.hrr_dim, forgetting=args.forgetting or None, drop_trust=args.drop_trust,
                        key_window=args.key_window, repeat_key_window=args.repeat_key_window)
    except ValueError as error:  # a bad R or key window (the config says which), or an attention arm
        raise SystemExit(f"cannot resize {args.checkpoint}: {error}") from None
    memory = model.model.memory
    record = {"command": "python " + shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
              "earlier_commands": earlier_commands(Path(args.checkpoint)),
              "attached_to_bare_trunk": attached, "read_trust": read_trust_record(Path(args.checkpoint)),
              "hrr_dim": args.hrr_dim, "key_window": model.config.key_window,
              "repeat_key_window": model.config.repeat_key_window, "forgetting": model.config.forgetting,
              "trained": {k: float(getattr(memory, k).detach()) for k in KNOBS if hasattr(memory, k)}, "set": args.set}
    with torch.no_grad():
        for assignment in args.set:
            knob, _, value = assignment.partition("=")
            if knob not in KNOBS or not hasattr(memory, knob):
                raise SystemExit(f"--set {assignment}: this model's knobs are "
                                 f"{[k for k in KNOBS if hasattr(memory, k)]}")
            getattr(memory, knob).fill_(float(value))
    if args.noise_cap is not None:
        try:
            set_noise_cap(memory, args.noise_cap)
        except ValueError as error:
            raise SystemExit(f"--noise-cap {args.noise_cap}: {error}") from None
        record["noise_cap"] = args.noise_cap
    if args.calibrate:
        validation = Path(args.data).read_bytes()[VALIDATION[0]:VALIDATION[1]]
        lengths = [int(x) for x in args.lengths.split(",")]
        trials = []
        for setting in candidates(memory, args, model.config.uses_surprise, model.config.forgetting):
            with torch.no_grad():
                for knob, value in setting.items():
                    getattr(memory, knob).fill_(value)
                windows = bits_per_byte(model, bytes_to_ids(validation[:args.bpb_bytes]), window=2048)
                stream = bits_per_byte(model, bytes_to_ids(validation[:args.stream_bytes]))
            recall = evaluate_fact_recall(model, validation, lengths, args.documents, 8, args.seed, "train",
                                          progress=False)
            trials.append({**setting, "recall": sum(r["greedy"] for r in recall.values()) / len(recall),
                           "recall_by_length": {L: r["greedy"] for L, r in recall.items()},
                           "bpb_windows": windows, "bpb_stream": stream})
            print(", ".join(f"{k} {v:g}" for k, v in setting.items()) + f": training-part recall "
                  f"{trials[-1]['recall']:.3f}, validation bits/byte {windows:.4f} (windows) {stream:.4f} (stream)",
                  flush=True)
        # a loud read or a full memory is noise on every byte: the best recall among the settings that cost at
        # most 0.01 bits/byte over the trained one, in windows and as a stream; ties toward the trained setting
        limit = trials[0]["bpb_windows"] + 0.01
        allowed = [t for t in trials if t["bpb_windows"] <= limit and t["bpb_stream"] <= limit]
        if not allowed:
            raise SystemExit(f"no setting keeps validation bits/byte within {limit:.4f}, stream included: "
                             "try forgetting (--forgetting) or lower read scales")
        best = max(allowed, key=lambda t: (round(t["recall"], 2),
                                           -sum(abs(t[k] - trials[0][k]) for k in trials[0] if k in KNOBS)))
        with torch.no_grad():
            for knob in KNOBS:
                if knob in best:
                    getattr(memory, knob).fill_(best[knob])
        record |= {"calibration": trials, "chosen": {k: best[k] for k in KNOBS if k in best},
                   "calibration_lengths": lengths, "calibration_documents": args.documents, "seed": args.seed}
        print("chosen: " + ", ".join(f"{k} {best[k]:g}" for k in KNOBS if k in best))
    model.save_pretrained(args.out)
    Path(args.out, "resize.json").write_text(json.dumps(record, indent=1))
    if Path(args.checkpoint, "training.json").exists():  # how it was trained travels with it (model card)
        shutil.copy(Path(args.checkpoint, "training.json"), Path(args.out, "training.json"))
    print(f"wrote {args.out} (R = {args.hrr_dim}, forgetting {'on' if model.config.forgetting else 'off'})")


if __name__ == "__main__":
    main()
