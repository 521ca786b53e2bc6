"""kathleen-notebook: a byte-level, attention-free language model with a holographic notebook memory.

Importing the package registers the classes with the Transformers Auto factories, so tools that load
a checkpoint without `trust_remote_code` (evaluate, lm-eval) work after `import modeling_kathleen_notebook`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .cache import KathleenCache
from .configuration_kathleen import KathleenConfig
from .configuration_notebook_adapter import NotebookAdapterConfig
from .modeling_kathleen import KathleenForCausalLM, KathleenModel, KathleenPreTrainedModel
from .modeling_notebook_adapter import NotebookAdapterCache, NotebookAdapterForCausalLM

__version__ = "0.1.0"

AutoConfig.register(KathleenConfig.model_type, KathleenConfig, exist_ok=True)
AutoModel.register(KathleenConfig, KathleenModel, exist_ok=True)
AutoModelForCausalLM.register(KathleenConfig, KathleenForCausalLM, exist_ok=True)
# save_pretrained writes these files and an auto_map next to the weights, for trust_remote_code
KathleenConfig.register_for_auto_class()
KathleenModel.register_for_auto_class("AutoModel")
KathleenForCausalLM.register_for_auto_class("AutoModelForCausalLM")
AutoConfig.register(NotebookAdapterConfig.model_type, NotebookAdapterConfig, exist_ok=True)
AutoModelForCausalLM.register(NotebookAdapterConfig, NotebookAdapterForCausalLM, exist_ok=True)
NotebookAdapterConfig.register_for_auto_class()
NotebookAdapterForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["KathleenCache", "KathleenConfig", "KathleenForCausalLM", "KathleenModel", "KathleenPreTrainedModel",
           "NotebookAdapterCache", "NotebookAdapterConfig", "NotebookAdapterForCausalLM"]
