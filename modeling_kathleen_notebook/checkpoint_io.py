"""Safe checkpoint folders: files replaced atomically, only safetensors read, shape errors that name tensors."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError

from .atomic import write_atomically
from .kernels import SOURCE_FILE, fetch_source, source_path
from .tokenization_kathleen import byte_tokenizer


def minimal_model_card(model) -> str:
    """A model card from the config alone, for a folder that has none yet (a measured one comes from
    scripts/measure_checkpoint.py and scripts/make_model_card.py, and is never overwritten)."""
    config = model.config
    memory = getattr(config, "notebook_config", config)  # the adapter keeps the notebook's settings apart
    notebook = (f"notebook R = {memory.hrr_dim}, {memory.key_binding} keys, writes by {memory.write_signal}, "
                f"forgetting {'on' if memory.forgetting else 'off'}") if memory.memory == "notebook" else \
        f"memory: {memory.memory}"
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags:
- byte-level
- kathleen-notebook
---

# {type(model).__name__}

A byte-level causal language model saved by kathleen-notebook: {sum(p.numel() for p in model.parameters()):,}
parameters, model type `{config.model_type}`, {notebook}. Byte b is token b + 3 (pad 0, eos 1, unk 2).

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("PATH_OR_REPO", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("PATH_OR_REPO", trust_remote_code=False)  # a plain tokenizer.json
```

No measurements yet: `python scripts/measure_checkpoint.py FOLDER` and `python scripts/make_model_card.py FOLDER
--results FOLDER/measurements.json` (kathleen-notebook repository) write a measured card in place of this one.

The author of "Kathleen Remembers" (arXiv 2608.30376) reports a pending US provisional patent application
(No. 64/140,260) on the notebook mechanism. Check its status before commercial use.
"""


def config_overrides(config_class, path: str, kwargs: dict, hub: dict) -> dict:
    """The settings by which the config `from_pretrained` builds differs from the one stored at `path`: keyword
    arguments, or a whole `config=` (what the Auto classes pass on after reading their keyword arguments)."""
    stored = config_class.from_pretrained(path, **hub).to_dict()
    given = kwargs["config"].to_dict() if hasattr(kwargs.get("config"), "to_dict") else kwargs
    return {name: value for name, value in given.items()
            if name in stored and stored[name] != value and not name.startswith("_")
            and name not in ("dtype", "torch_dtype", "transformers_version")}


def described_config(overrides: dict) -> str:
    """The config an error names: its config.json, and the settings `from_pretrained` was given in place of its own."""
    settings = ", ".join(f"{name}={value!r}" for name, value in overrides.items())
    return f"its config.json with {settings}" if overrides else "its config.json"


def describe_shape_mismatch(model_class, path: str, overrides: dict, hub: dict) -> str:
    """Which tensors of `path`'s model.safetensors do not fit the model its config (and `overrides`) describe."""
    from safetensors import safe_open
    from transformers.utils import cached_file

    config = model_class.config_class.from_pretrained(path, **hub, **overrides)
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in model_class(config).state_dict().items()}
    with safe_open(cached_file(path, "model.safetensors", **hub), framework="pt") as handle:
        stored = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    wrong = [f"{name}: checkpoint {stored[name]} vs config {expected[name]}"
             for name in sorted(stored) if name in expected and stored[name] != expected[name]]
    return (f"the weights in {path} do not match {described_config(overrides)}: " + "; ".join(wrong[:5])
            + (f" (and {len(wrong) - 5} more)" if len(wrong) > 5 else ""))


NUMBERED = re.compile(r"^(.*?)\.(\d+)\.")  # "model.trunk.blocks.2.ffn_in.weight" -> ("model.trunk.blocks", "2")


def describe_count_mismatch(model, loading_info: dict) -> str | None:
    """Where the checkpoint holds a different number of numbered modules (trunk blocks, decoder layers) than the
    model its config builds: Transformers would drop the extra trained ones, or leave the new ones at random, and
    only log it. None when every numbered module list has the same length in both."""
    missing, unexpected = set(loading_info["missing_keys"]), set(loading_info["unexpected_keys"])
    built, stored = {}, {}
    for name in model.state_dict():
        if match := NUMBERED.match(name):
            built.setdefault(match[1], set()).add(int(match[2]))
            if name not in missing:
                stored.setdefault(match[1], set()).add(int(match[2]))
    for name in unexpected:
        if match := NUMBERED.match(name):
            stored.setdefault(match[1], set()).add(int(match[2]))
    for modules in sorted(built.keys() | stored.keys()):
        have, want = stored.get(modules, set()), built.get(modules, set())
        if have and have != want:
            effect = (f"drop {len(have - want)} trained one(s)" if len(have) > len(want) else
                      f"leave {len(want - have)} new one(s) untrained")
            return (f"the checkpoint holds {len(have)} {modules} where the config builds {len(want)}: loading "
                    f"would {effect}")
    return None


class SafeCheckpointMixin:
    """For a `PreTrainedModel`: `from_pretrained` reads only safetensors (never a pickle) and turns an
    unreadable or ill-fitting weights file into a `ValueError` that names the file or the tensors;
    `save_pretrained` adds the byte tokenizer, the kernels' C++ source and `remote_code_auto_map`, and replaces
    each file atomically, so the folder is complete and a save killed midway leaves the previous checkpoint
    loadable."""

    remote_code_auto_map: dict[str, str] = {}

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        kwargs.setdefault("use_safetensors", True)
        path = str(pretrained_model_name_or_path)
        hub = {k: kwargs[k] for k in ("revision", "cache_dir", "token", "local_files_only") if k in kwargs}
        fetch_source(path, **hub)  # the kernels' C++ source, for remote code
        wants_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True,
                                                  **kwargs)
        except SafetensorError as error:
            raise ValueError(
                f"the weights of {path} cannot be read (truncated or corrupted model.safetensors?): {error}"
            ) from error
        except RuntimeError as error:
            if "mismatched_sizes" not in str(error):
                raise
            overrides = config_overrides(cls.config_class, path, kwargs, hub)
            raise ValueError(describe_shape_mismatch(cls, path, overrides, hub)) from error
        if problem := describe_count_mismatch(model, info):
            overrides = config_overrides(cls.config_class, path, kwargs, hub)
            raise ValueError(f"the weights in {path} do not fit {described_config(overrides)}: {problem}; "
                             "load it with the checkpoint's own config")
        return (model, info) if wants_info else model

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        self.config.auto_map = dict(self.remote_code_auto_map)  # every Auto class, not only this one
        card = None if (Path(save_directory) / "README.md").exists() else minimal_model_card(self)  # keep a card
        if not kwargs.get("is_main_process", True) or kwargs.get("push_to_hub"):
            if card is not None and kwargs.get("is_main_process", True):
                Path(save_directory).mkdir(parents=True, exist_ok=True)
                (Path(save_directory) / "README.md").write_text(card)
            return super().save_pretrained(save_directory, *args, **kwargs)

        def write(folder: str) -> None:
            super(SafeCheckpointMixin, self).save_pretrained(folder, *args, **kwargs)
            byte_tokenizer().save_pretrained(folder)
            if source_path().exists():  # Transformers copies the remote code's Python files only
                shutil.copyfile(source_path(), Path(folder) / SOURCE_FILE)
            if card is not None:
                (Path(folder) / "README.md").write_text(card)

        write_atomically(save_directory, write, folder=True)
