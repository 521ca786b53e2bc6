"""Exact bits/byte of text files: `kathleen-notebook eval-bpb MODEL FILE... [options]`, as a script.

    python scripts/eval_bpb.py runs/text-notebook/final ../shared/data/enwiki_excerpt.xml \
        --byte-range 5480771 6089746 --window 2048
    python scripts/eval_bpb.py --write-lm-eval-text FILE [--byte-range A B]   (for configuration/lm_eval)
"""

import sys

from modeling_kathleen_notebook.cli import main

if __name__ == "__main__":
    main(["eval-bpb", *sys.argv[1:]])
