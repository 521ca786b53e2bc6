"""Write a Hugging Face Space (Gradio SDK) that serves the memory workbench: app.py, requirements.txt, a README with
the Space's metadata, and a copy of the package (with the shipped checkpoint, or --model's folder copied in).

    python scripts/make_space.py OUT [--model CHECKPOINT_FOLDER_OR_HUB_ID]
    cd OUT && python app.py                                    # try it locally: the page the Space will show
    huggingface-cli upload USER/SPACE_NAME OUT . --repo-type space     # publish it

The Space installs only requirements.txt (a CPU torch); the package travels as source, so nothing is fetched
from PyPI under this project's name.
"""

from __future__ import annotations

import argparse
import shutil
from importlib.metadata import version
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "modeling_kathleen_notebook"
REQUIREMENTS = """\
--extra-index-url https://download.pytorch.org/whl/cpu
torch>=2.4
transformers>=5.23,<6
safetensors>=0.4
accelerate>=1.0
huggingface-hub>=1.0
tokenizers>=0.20
tqdm
matplotlib
ninja
gradio>=6,<7
"""
APP = '''"""The kathleen-notebook memory workbench as a Space (made by scripts/make_space.py)."""

from pathlib import Path

import modeling_kathleen_notebook
from modeling_kathleen_notebook.workbench import build_app

MODEL = {model}  # None: the checkpoint shipped inside the package

print(f"kathleen-notebook package at {{modeling_kathleen_notebook.__file__}}", flush=True)
build_app(MODEL).launch()  # a Space sets GRADIO_SERVER_NAME / GRADIO_SERVER_PORT
'''
CARD = """---
title: kathleen-notebook memory workbench
emoji: 📓
colorFrom: yellow
colorTo: blue
sdk: gradio
sdk_version: {gradio_version}
app_file: app.py
pinned: false
license: apache-2.0
---

# kathleen-notebook memory workbench

Read documents into the notebook memory of a byte-level, attention-free language model, ask, see which source
sentence each recalled byte came from, unlearn a sentence or a whole source and ask again, and save the memory.
Model: `{model}`. Each browser session has its own memory.
"""


def make_space(out: Path, model: str | None = None) -> Path:
    """Write the Space folder `out` (refuses a non-empty one); returns it."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists and is not empty: choose a new folder")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE, out / PACKAGE.name, ignore=ignore)
    expression = repr(model)
    if model is not None and Path(model).is_dir():  # a local checkpoint travels with the Space
        shutil.copytree(model, out / "model", ignore=ignore)
        expression = 'str(Path(__file__).resolve().parent / "model")'
    (out / "app.py").write_text(APP.format(model=expression))
    (out / "requirements.txt").write_text(REQUIREMENTS)
    shown = Path(model).name if model is not None and Path(model).is_dir() else model
    (out / "README.md").write_text(CARD.format(model=shown or "kathleen-notebook-0.5m (shipped)",
                                               gradio_version=version("gradio")))  # the version it was tested with
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the Space folder to write (new or empty)")
    parser.add_argument("--model", help="a checkpoint folder (copied in) or Hub id (default: the shipped one)")
    args = parser.parse_args()
    if args.model is not None and not Path(args.model).is_dir() and "/" not in args.model:
        raise SystemExit(f"--model {args.model!r} is neither a folder nor a Hub id (user/name)")
    print(f"wrote {make_space(args.out, args.model)}: app.py, requirements.txt, README.md, the package")


if __name__ == "__main__":
    main()
