"""Train a Kathleen model: the same as `kathleen-notebook train CONFIG [section.key=value ...] [--resume]`.

    python scripts/train.py configuration/presets/text-notebook.json train.max_minutes=60
    torchrun --standalone --nproc_per_node 2 scripts/train.py CONFIG ...     data-parallel, 2 processes
"""

import sys

from modeling_kathleen_notebook.cli import main

if __name__ == "__main__":
    main(["train", *sys.argv[1:]])
