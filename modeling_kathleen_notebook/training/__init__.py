"""Training with `accelerate` (`kathleen-notebook train`): a typed training config (config.py), the data (data.py),
the loop (loop.py). Not part of a checkpoint's remote code."""

from .config import TrainingConfig, load_training_config
from .loop import train

__all__ = ["TrainingConfig", "load_training_config", "train"]
