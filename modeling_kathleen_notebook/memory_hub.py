"""A `NotebookSession`'s memory on the Hugging Face Hub: a repository holding the memory file and a small card
that names its model (`NotebookSession.push_to_hub` / `from_hub` call these)."""

from __future__ import annotations

import logging
from pathlib import Path

from .cache import read_safetensors
from .session import MEMORY_FILE, SESSION_FORMAT, NotebookSession

logger = logging.getLogger(__name__)


def save_to_folder(session: NotebookSession, folder: str) -> None:
    """What `push_to_hub` uploads: the memory file and a small card (its model, what it read, how to load)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    session.save(str(Path(folder) / MEMORY_FILE))
    summary = session.summary()
    sources = sorted({s.source for s in session.segments})
    model = session.model_path or "(not recorded: pass model= when loading)"
    (Path(folder) / "README.md").write_text(f"""---
tags:
- kathleen-notebook
- kathleen-notebook-memory
---

# A kathleen-notebook memory

The notebook state of `{model}` after reading {summary["bytes_read"]:,} bytes from {len(sources)} source(s):
{", ".join(f"`{s}`" for s in sources[:20])}{" ..." if len(sources) > 20 else ""}. {summary["segments"]} segments,
{summary["erased_positions"]:,} bytes unlearned, write mass {summary["write_mass"]:.1f}. The file refuses to load
into any other model.

```python
from modeling_kathleen_notebook.session import NotebookSession
session = NotebookSession.from_hub("REPO_ID")      # loads its model too; pip install kathleen-notebook
print(session.ask_text("a question", max_new_tokens=32))
```
""")

def push_to_hub(session: NotebookSession, repo_id: str, private: bool | None = None, token: str | None = None,
                commit_message: str = "Upload a kathleen-notebook memory") -> str:
    """Share this memory as a Hub model repository (`save_to_folder`'s files); returns the commit's URL."""
    import tempfile

    from huggingface_hub import HfApi

    if session.model_path and Path(session.model_path).exists():
        logger.warning("this memory records its model as the local path %s: others will need model= to load "
                       "it (build the session from a Hub id to record that instead)", session.model_path)
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        save_to_folder(session, folder)
        card = Path(folder) / "README.md"
        card.write_text(card.read_text().replace("REPO_ID", repo_id))
        return str(api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message))

def from_hub(repo_id: str, model: str | None = None, revision: str | None = None, **hub_kwargs) -> NotebookSession:
    """A session with the memory of a Hub repository made by `push_to_hub` (or a local folder of
    `save_to_folder`): the file comes through the Hub cache, so offline (HF_HUB_OFFLINE=1) a cached copy
    loads. The model is the one the memory records, unless `model` names another folder or Hub id."""
    if Path(repo_id).is_dir():
        path = str(Path(repo_id) / MEMORY_FILE)
    else:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo_id, MEMORY_FILE, revision=revision, **hub_kwargs)
    _, metadata = read_safetensors(path, SESSION_FORMAT)
    model = model or metadata.get("model_path")
    if not model:
        raise ValueError(f"{repo_id}'s memory does not record its model: pass model=")
    session = NotebookSession.from_pretrained(model)
    session.load(path)
    return session
