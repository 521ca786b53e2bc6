"""Safe checkpoint folders: files replaced atomically, only safetensors read, shape errors that name tensors."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

STAGING_PREFIX = ".saving-"


def save_folder_atomically(target: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Let `write(folder)` fill a staging folder inside `target`, then move each file into place with
    an atomic rename. A process killed mid-save leaves every file of the previous save readable."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for stale in target.glob(STAGING_PREFIX + "*"):  # left by a save that was killed
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(dir=target, prefix=STAGING_PREFIX))
    try:
        write(str(staging))
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        for path in sorted(staging.iterdir()):
            os.replace(path, target / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def describe_shape_mismatch(model_class, path: str, **kwargs) -> str:
    """Which tensors of `path`'s model.safetensors do not fit the model its config.json describes."""
    from safetensors import safe_open
    from transformers.utils import cached_file

    config = model_class.config_class.from_pretrained(path, **kwargs)
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in model_class(config).state_dict().items()}
    with safe_open(cached_file(path, "model.safetensors", **kwargs), framework="pt") as handle:
        stored = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    wrong = [f"{name}: checkpoint {stored[name]} vs config {expected[name]}"
             for name in sorted(stored) if name in expected and stored[name] != expected[name]]
    return (f"the weights in {path} do not match its config.json: " + "; ".join(wrong[:5])
            + (f" (and {len(wrong) - 5} more)" if len(wrong) > 5 else ""))
