"""Copy a trained checkpoint into the package as the shipped default, with its measured model card.

    python scripts/ship_checkpoint.py runs/demo/final --run runs/demo
    python scripts/ship_checkpoint.py runs/demo/final --run runs/demo --skip-measure   (after a code change)
    python scripts/ship_checkpoint.py CHECKPOINT --skip-measure   (training facts from CHECKPOINT/training.json)

Steps (each a script of its own, run here in order): measure_checkpoint.py -> make_model_card.py ->
save_pretrained into modeling_kathleen_notebook/pretrained/kathleen-notebook-0.5m (weights, config,
tokenizer, the flat remote code, README.md card, measurements.json and the history the card is made from:
training.json, resize.json, read_trust.json). The remote-code files in that
folder are save_pretrained's copies of the package modules; tests/test_demo.py fails if they drift.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from modeling_kathleen_notebook import KathleenForCausalLM
from modeling_kathleen_notebook.session import DEFAULT_CHECKPOINT

SCRIPTS = Path(__file__).resolve().parent
HISTORY = ("training.json", "resize.json", "read_trust.json")  # what make_model_card.py reads besides the figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--run", help="the training output_dir (config.json, metrics.jsonl); default: the "
                        "checkpoint's training.json")
    parser.add_argument("--skip-measure", action="store_true", help="reuse CHECKPOINT/measurements.json")
    args = parser.parse_args()
    checkpoint = Path(args.checkpoint)
    if not args.skip_measure:
        subprocess.run([sys.executable, str(SCRIPTS / "measure_checkpoint.py"), args.checkpoint], check=True)
    run = ["--run", args.run] if args.run else []
    subprocess.run([sys.executable, str(SCRIPTS / "make_model_card.py"), args.checkpoint, "--results",
                    str(checkpoint / "measurements.json"), *run], check=True)
    if DEFAULT_CHECKPOINT.exists():
        shutil.rmtree(DEFAULT_CHECKPOINT)
    KathleenForCausalLM.from_pretrained(checkpoint).save_pretrained(DEFAULT_CHECKPOINT)
    for name in ("README.md", "measurements.json", *HISTORY):
        if (checkpoint / name).exists():
            shutil.copy(checkpoint / name, DEFAULT_CHECKPOINT / name)
    size = sum(p.stat().st_size for p in DEFAULT_CHECKPOINT.rglob("*") if p.is_file())
    print(f"shipped {DEFAULT_CHECKPOINT} ({size:,} bytes)")


if __name__ == "__main__":
    main()
