"""KathleenCache: constant size, batch operations as one tree-map, safetensors save/load with checks."""

import os

import pytest
import torch

from conftest import tiny_model
from modeling_kathleen_notebook import KathleenCache


def state_bytes(cache):
    return sum(t.numel() * t.element_size() for t in cache.state_tensors().values())


def test_size_does_not_grow_with_length():
    model = tiny_model()
    with torch.no_grad():
        short = model(torch.randint(3, 259, (1, 10))).cache
        long = model(torch.randint(3, 259, (1, 2000))).cache
    assert state_bytes(short) == state_bytes(long)


def test_reorder_select_repeat_act_on_every_tensor():
    model = tiny_model(std=0.3)
    with torch.no_grad():
        cache = model(torch.randint(3, 259, (3, 20))).cache
    rows = {name: t.clone() for name, t in cache.state_tensors().items()}
    cache.reorder_cache(torch.tensor([2, 0, 1]))
    for name, t in cache.state_tensors().items():
        assert torch.equal(t, rows[name][[2, 0, 1]]), name
    cache.batch_repeat_interleave(2)
    cache.batch_select_indices(torch.tensor([0, 5]))
    for name, t in cache.state_tensors().items():
        assert torch.equal(t, rows[name][[2, 1]]), name


def test_save_load_roundtrip_continues_exactly(tmp_path):
    model = tiny_model(std=0.3)
    ids = torch.randint(3, 259, (2, 60))
    with torch.no_grad():
        full = model(ids).logits
        cache = model(ids[:, :40]).cache
        cache.save(tmp_path / "memory.safetensors")
        loaded = KathleenCache.load(tmp_path / "memory.safetensors", model.config)
        assert loaded.get_seq_length() == 40
        rest = model(ids[:, 40:], cache=loaded).logits
    torch.testing.assert_close(rest, full[:, 40:], rtol=0, atol=1e-4)


def test_load_refuses_foreign_truncated_and_wrong_version(tmp_path):
    model = tiny_model()
    path = tmp_path / "memory.safetensors"
    with torch.no_grad():
        model(torch.randint(3, 259, (1, 20))).cache.save(path)
    with pytest.raises(ValueError, match="fingerprint"):
        KathleenCache.load(path, tiny_model(hrr_dim=128).config)
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        KathleenCache.load(tmp_path / "cut.safetensors", model.config)
    (tmp_path / "noise.safetensors").write_bytes(os.urandom(500))
    with pytest.raises(ValueError, match="truncated or corrupted"):
        KathleenCache.load(tmp_path / "noise.safetensors", model.config)
    (tmp_path / "v9.safetensors").write_bytes(data.replace(b'"format_version":"2"', b'"format_version":"9"'))
    with pytest.raises(ValueError, match="version"):
        KathleenCache.load(tmp_path / "v9.safetensors", model.config)


def as_version_1(path, new_path, renamed):
    """Rewrite a cache file as format version 1 wrote it: the notebook's spectrum under its old name."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {renamed.get(name, name): handle.get_tensor(name) for name in handle.keys()
                   if renamed.get(name, name) is not None}  # renamed to None: left out
    metadata["format_version"] = "1"
    if "complex" in metadata:
        metadata["complex"] = metadata["complex"].replace("memory.spectrum", "memory.memory")
    save_file(tensors, str(new_path), metadata=metadata)


def test_a_version_1_file_still_loads(tmp_path):
    """Version 2 renamed the notebook state's `memory` to `spectrum`: a version-1 file loads and continues exactly;
    the negative control, a version-1 name in a version-2 file, is refused as incomplete."""
    model = tiny_model(std=0.3)
    ids = torch.randint(3, 259, (1, 60))
    with torch.no_grad():
        full = model(ids).logits
        model(ids[:, :40]).cache.save(tmp_path / "v2.safetensors")
    as_version_1(tmp_path / "v2.safetensors", tmp_path / "v1.safetensors", {"memory.spectrum": "memory.memory"})
    with torch.no_grad():
        rest = model(ids[:, 40:], cache=KathleenCache.load(tmp_path / "v1.safetensors", model.config)).logits
    torch.testing.assert_close(rest, full[:, 40:], rtol=0, atol=1e-4)
    data = (tmp_path / "v1.safetensors").read_bytes().replace(b'"format_version":"1"', b'"format_version":"2"')
    (tmp_path / "mixed.safetensors").write_bytes(data)
    with pytest.raises(ValueError, match="lacks the state tensor"):
        KathleenCache.load(tmp_path / "mixed.safetensors", model.config)


def test_a_previous_key_attention_cache_continues_and_an_older_attention_file_loads(tmp_path):
    """The previous-key attention arm keeps the key its next position gets: saved and loaded, decoding continues
    exactly. An attention file from before that field (current keys) still loads."""
    model = tiny_model(std=0.3, memory="attention", attention_keys="previous")
    ids = torch.randint(3, 259, (1, 50))
    with torch.no_grad():
        full = model(ids).logits
        model(ids[:, :30]).cache.save(tmp_path / "previous.safetensors")
        rest = model(ids[:, 30:], cache=KathleenCache.load(tmp_path / "previous.safetensors", model.config)).logits
    torch.testing.assert_close(rest, full[:, 30:], rtol=0, atol=1e-4)
    current = tiny_model(std=0.3, memory="attention")  # the same weights (same seed), keys from position t
    with torch.no_grad():
        assert (current(ids).logits - full).abs().max() > 1e-3  # control: the shift changes the reads
    with torch.no_grad():
        current(ids[:, :30]).cache.save(tmp_path / "current.safetensors")
    as_version_1(tmp_path / "current.safetensors", tmp_path / "old.safetensors", {"memory.pending_key": None})
    loaded = KathleenCache.load(tmp_path / "old.safetensors", current.config)
    assert loaded.memory.pending_key.shape == (1, 0)


def test_save_is_atomic_and_refuses_empty(tmp_path):
    model = tiny_model()
    with pytest.raises(ValueError, match="empty"):
        KathleenCache(model.config).save(tmp_path / "m.safetensors")
    with torch.no_grad():
        model(torch.randint(3, 259, (1, 20))).cache.save(tmp_path / "m.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temporary file left behind


def test_saving_onto_a_folder_names_it_and_writes_nothing(tmp_path):
    """A folder given as the file to save: one clear error before anything is written (the rename into place used to
    fail, naming the staging path). Control: the same call onto a file path saves."""
    model = tiny_model()
    with torch.no_grad():
        cache = model(torch.randint(3, 259, (1, 20))).cache
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError, match="folder: give the path of a file"):
        cache.save(tmp_path / "folder")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["folder"]
    cache.save(tmp_path / "folder" / "m.safetensors")
    assert (tmp_path / "folder" / "m.safetensors").is_file()
