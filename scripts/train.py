"""Train a Kathleen model: the same as `kathleen-notebook train CONFIG [section.key=value ...] [--resume]`.

    python scripts/train.py configuration/presets/text-notebook.json train.max_minutes=60
    accelerate launch --num_processes 2 --cpu scripts/train.py CONFIG ...     data-parallel
"""

import sys

from modeling_kathleen_notebook.cli import main

if __name__ == "__main__":
    main(["train", *sys.argv[1:]])
