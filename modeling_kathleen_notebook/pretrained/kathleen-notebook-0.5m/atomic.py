"""Writing files so that a process killed midway leaves the previous version readable: write a staging copy, fsync
it, then rename it into place (a rename within one file system is atomic)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

STAGING_PREFIX = ".saving-"


def write_atomically(target: str | os.PathLike, write: Callable[[str], None], folder: bool = False) -> None:
    """Let `write(path)` fill a staging path, then rename what it wrote into place: a file at `target`, or with
    folder=True each file `write` put in a staging folder, into the folder `target` (files it did not write stay).
    Staging left beside the target by a write that was killed is removed first."""
    target = Path(target)
    if not folder and target.is_dir():  # else the rename at the end fails, naming the staging path
        raise IsADirectoryError(f"{target} is a folder: give the path of a file to write")
    parent = target if folder else target.parent
    parent.mkdir(parents=True, exist_ok=True)
    prefix = f"{STAGING_PREFIX}{target.name}-"
    for stale in parent.glob(prefix + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    try:
        written = staging if folder else staging / target.name
        write(str(written))
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        for path in sorted(staging.iterdir()) if folder else [written]:
            os.replace(path, target / path.name if folder else target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
