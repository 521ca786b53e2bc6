"""The needle laboratory: the same as `kathleen-notebook needle [--quick] [options]`.

    python scripts/needle_lab.py --quick      under 20 minutes on the 2-core machine
    python scripts/needle_lab.py              the full setting of configuration/experiments/needle.json
"""

import sys

from modeling_kathleen_notebook.cli import main

if __name__ == "__main__":
    main(["needle", *sys.argv[1:]])
