"""Upload a checkpoint (weights, config, tokenizer, remote code, model card) to the Hugging Face Hub.

    python scripts/push_to_hub.py CHECKPOINT REPO_ID [--private] [--dry-run [--upload-dir DIR]]

--dry-run builds the exact folder that would be uploaded and checks, in a fresh offline process that
has never imported this package, that it loads by path with trust_remote_code and generates text.
A real upload needs a token (`huggingface-cli login` or HF_TOKEN) and network access.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from modeling_kathleen_notebook import KathleenForCausalLM

REQUIRED = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "modeling_kathleen.py", "configuration_kathleen.py", "README.md")
CHECK = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
assert "modeling_kathleen_notebook" not in sys.modules
ids = tokenizer("The ", return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=16, do_sample=False)
print("loaded offline:", type(model).__name__, repr(tokenizer.decode(out[0])))
"""


def build_upload_folder(checkpoint: Path, folder: Path) -> None:
    """save_pretrained again (weights, config, tokenizer, flat remote code), plus the card."""
    card = checkpoint / "README.md"
    if not card.exists():
        raise SystemExit(f"{checkpoint} has no README.md model card: run scripts/make_model_card.py first")
    KathleenForCausalLM.from_pretrained(checkpoint).save_pretrained(folder)
    shutil.copy(card, folder / "README.md")
    missing = [name for name in REQUIRED if not (folder / name).exists()]
    if missing:
        raise SystemExit(f"the upload folder lacks {missing}")


def verify_offline(folder: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    with tempfile.TemporaryDirectory() as elsewhere:
        result = subprocess.run([sys.executable, "-c", CHECK, str(folder.resolve())], cwd=elsewhere, env=env,
                                capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise SystemExit(f"the upload folder does not load in a fresh process:\n{result.stderr[-3000:]}")
    print(result.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("repo_id")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--upload-dir", help="where to build the upload folder (default: a temporary one)")
    args = parser.parse_args()
    folder = Path(args.upload_dir or tempfile.mkdtemp(prefix="kathleen-upload-"))
    build_upload_folder(Path(args.checkpoint), folder)
    verify_offline(folder)
    print(f"upload folder: {folder} ({sum(p.stat().st_size for p in folder.rglob('*') if p.is_file()):,} bytes)")
    if args.dry_run:
        return
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(args.repo_id, private=args.private, exist_ok=True)
    api.upload_folder(repo_id=args.repo_id, folder_path=str(folder), commit_message="Upload kathleen-notebook model")
    print(f"uploaded to {args.repo_id}")


if __name__ == "__main__":
    main()
