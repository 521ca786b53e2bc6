"""The bare trunk of a checkpoint: its trunk and byte head, memory "none" (the repeat probe's baseline).

    python scripts/bare_trunk.py modeling_kathleen_notebook/pretrained/kathleen-notebook-0.5m runs/shipped-trunk

For a notebook attached to a trunk trained alone (scripts/resize_memory.py on a bare trunk: resize.json says
"attached_to_bare_trunk"), this is that trunk, weight for weight, so `measure_checkpoint.py --trunk` can compare
with it when the trunk's own folder is not at hand. For a jointly trained model it is the model's own trunk (what
the first-mention cost's trunk share measures), not a trunk trained alone: the record (bare_trunk.json) says which.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM


def bare_trunk(model: KathleenForCausalLM) -> KathleenForCausalLM:
    """The model without its memory: every trunk and head weight copied, nothing else."""
    trunk = KathleenForCausalLM(KathleenConfig(**{**model.config.to_dict(), "memory": "none"})).eval()
    missing, unexpected = trunk.load_state_dict(model.state_dict(), strict=False)
    if missing or not all(name.startswith("model.memory.") for name in unexpected):
        raise ValueError(f"the trunk's weights did not carry over: missing {missing}, "
                         f"left out {[n for n in unexpected if not n.startswith('model.memory.')]}")
    return trunk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    args = parser.parse_args()
    model = KathleenForCausalLM.from_pretrained(args.checkpoint)
    if model.config.memory == "none":
        raise SystemExit(f"{args.checkpoint} has no memory: it is a bare trunk already")
    resize = Path(args.checkpoint) / "resize.json"
    attached = resize.exists() and bool(json.loads(resize.read_text()).get("attached_to_bare_trunk"))
    bare_trunk(model).save_pretrained(args.out)
    record = {"command": "python " + shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
              "trained_alone": attached}
    (Path(args.out) / "bare_trunk.json").write_text(json.dumps(record, indent=1))
    kind = "the trunk it was attached to" if attached else "its own trunk, trained beside its memory"
    print(f"wrote {args.out}: {kind}")


if __name__ == "__main__":
    main()
