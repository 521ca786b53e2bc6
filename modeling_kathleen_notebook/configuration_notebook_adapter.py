"""Configuration of the notebook adapter: any Transformers causal LM over the 259-byte vocabulary as
the trunk, plus the Kathleen notebook (SPEC §3), whose logit bias is added to the trunk's logits."""

from __future__ import annotations

from transformers import AutoConfig, PreTrainedConfig

from .configuration_kathleen import EOS_ID, PAD_ID, KathleenConfig, register_unless_known, with_legacy_settings

ADAPTER_MEMORY_KINDS = ("notebook", "none")


class NotebookAdapterConfig(PreTrainedConfig):
    r"""A base causal LM's config and the notebook's settings.

    Args:
        base_config (`PreTrainedConfig | dict`): config of the trunk, any model type that
            `AutoModelForCausalLM.from_config` builds (e.g. `LlamaConfig`, `GPT2Config`, `MambaConfig`);
            a dict needs its "model_type". Its vocab_size must equal the notebook's (259 bytes + specials).
        notebook_config (`KathleenConfig | dict`, default `KathleenConfig()`): the notebook's settings
            (hrr_dim, key_window, gate_*, forgetting, ...; trunk fields are ignored). memory="none" builds
            the base model alone inside the same wrapper: the control arm of an experiment.
        use_cache (`bool`, True): return a `NotebookAdapterCache` from forward.
    """

    model_type = "kathleen_notebook_adapter"
    sub_configs = {"base_config": AutoConfig, "notebook_config": KathleenConfig}

    def __init__(
        self,
        base_config: PreTrainedConfig | dict | None = None,
        notebook_config: KathleenConfig | dict | None = None,
        use_cache: bool = True,
        **kwargs,
    ):
        if base_config is None:
            raise ValueError("NotebookAdapterConfig needs a base_config (the trunk's config)")
        if isinstance(base_config, dict):
            base_config = {"pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "bos_token_id": EOS_ID, **base_config}
            if "model_type" not in base_config:
                raise ValueError("a base_config given as a dict needs its 'model_type' (e.g. 'llama', 'mamba')")
            base_config = AutoConfig.for_model(base_config.pop("model_type"), **base_config)
        if notebook_config is None or isinstance(notebook_config, dict):
            notebook_config = KathleenConfig(**(notebook_config or {}))
        self.base_config = base_config
        self.notebook_config = notebook_config
        self.use_cache = use_cache
        for name in ("vocab_size", "pad_token_id", "eos_token_id", "bos_token_id"):
            kwargs.setdefault(name, getattr(notebook_config, name))
        kwargs.setdefault("initializer_range", notebook_config.initializer_range)  # the notebook's gate init
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        self.validate_adapter()

    def validate_adapter(self) -> None:
        """Raise a `ValueError` naming the first mismatch between the base model and the notebook."""
        if self.notebook_config.memory not in ADAPTER_MEMORY_KINDS:
            raise ValueError(f"the adapter's notebook_config.memory must be one of {ADAPTER_MEMORY_KINDS}, "
                             f"got {self.notebook_config.memory!r}")
        base_vocab = getattr(self.base_config, "vocab_size", None)
        if base_vocab != self.notebook_config.vocab_size:
            raise ValueError(f"the base model's vocab_size ({base_vocab}) must equal the notebook's "
                             f"({self.notebook_config.vocab_size}): both index the same byte vocabulary")
        if getattr(self.base_config, "pad_token_id", PAD_ID) not in (PAD_ID, None):
            raise ValueError(f"the base model's pad_token_id must be {PAD_ID} (the byte vocabulary's pad), "
                             f"got {self.base_config.pad_token_id}")

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> NotebookAdapterConfig:
        notebook_config = config_dict.get("notebook_config")
        if isinstance(notebook_config, dict):
            config_dict = {**config_dict, "notebook_config": with_legacy_settings(notebook_config)}
        return super().from_dict(config_dict, **kwargs)

    @property
    def memory(self) -> str:
        """The memory kind, "notebook" or "none", as `KathleenConfig.memory` (the needle lab reads either)."""
        return self.notebook_config.memory

    def to_dict(self) -> dict:
        output = super().to_dict()
        output["base_config"] = self.base_config.to_dict()
        output["notebook_config"] = self.notebook_config.to_dict()
        return output


register_unless_known(NotebookAdapterConfig)
