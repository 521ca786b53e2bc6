#!/usr/bin/env bash
# Create .venv in the project root (if missing) and install kathleen-notebook into it, editable.
#   bash scripts/install.sh           the package
#   bash scripts/install.sh --test    the package, its test tools, the experiments' extras (mambapy) and the
#                                     workbench's (Gradio) and export's (ONNX); scripts/install_browser.sh adds a browser
#                                     for its tests
# torch is pinned to the 2.13.0 CPU build when no torch is installed yet (an unpinned torch may pull a
# multi-GB CUDA build); install another torch into .venv first if you want one.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install --quiet torch==2.13.0
extra=""
[ "${1:-}" = "--test" ] && extra="[test,experiments,app,export]"
.venv/bin/python -m pip install --quiet -e ".${extra}"
