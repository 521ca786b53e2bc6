"""The notebook adapter on Transformers' own Llama, GPT-2 and Mamba classes: incremental decoding equals
the full forward, generate equals an uncached loop, and a saved folder loads in a fresh offline process."""

import pytest
import torch
from safetensors.torch import load_file

from conftest import count_crops, run_fresh_python
from modeling_kathleen_notebook import NotebookAdapterCache, NotebookAdapterConfig, NotebookAdapterForCausalLM

BASES = {
    "llama": dict(model_type="llama", vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2),
    "gpt2": dict(model_type="gpt2", vocab_size=259, n_embd=32, n_layer=2, n_head=2),
    "mamba": dict(model_type="mamba", vocab_size=259, hidden_size=32, num_hidden_layers=2, state_size=8),
}
NOTEBOOK = dict(hrr_dim=256, gate_embed_dim=8, scan_chunk=32)


def adapter(base: str, memory: str = "notebook", seed: int = 0) -> NotebookAdapterForCausalLM:
    torch.manual_seed(seed)
    config = NotebookAdapterConfig(base_config=BASES[base], notebook_config={**NOTEBOOK, "memory": memory})
    return NotebookAdapterForCausalLM(config).eval()


def repeated_text(batch: int = 2, length: int = 48) -> torch.Tensor:
    """Random bytes whose second half repeats the first, so the notebook has something to recall."""
    half = torch.randint(3, 259, (batch, length // 2), generator=torch.Generator().manual_seed(1))
    return torch.cat([half, half], dim=1)


@pytest.mark.parametrize("base", BASES)
@torch.no_grad()
def test_incremental_decoding_equals_full_forward(base):
    model = adapter(base)
    ids = repeated_text()
    full = model(ids, use_cache=False).logits
    out = model(ids[:, :19])
    pieces, cache = [out.logits], out.cache
    for t in range(19, ids.shape[1]):
        out = model(ids[:, t:t + 1], cache=cache)
        pieces.append(out.logits)
        cache = out.cache
    assert isinstance(cache, NotebookAdapterCache) and cache.get_seq_length() == ids.shape[1]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("base", BASES)
@torch.no_grad()
def test_logits_are_the_base_models_plus_the_notebooks(base):
    model = adapter(base)
    ids = repeated_text()
    out = model(ids, use_cache=False)
    torch.testing.assert_close(out.trunk_logits, model.trunk(ids, use_cache=False).logits)
    reads, _ = model.notebook(ids, torch.ones_like(ids, dtype=torch.bool), trunk_logits=out.trunk_logits)
    torch.testing.assert_close(out.memory_logits, model.notebook.trusted(reads, out.trunk_logits))  # trust at the head
    torch.testing.assert_close(out.logits, out.trunk_logits + out.memory_logits)
    last = model(ids, use_cache=False, logits_to_keep=1)
    torch.testing.assert_close(last.logits, out.logits[:, -1:])
    assert out.memory_logits[:, 30:].abs().max() > 0.1  # the repeat is read back
    bare = adapter(base, memory="none")
    assert bare.notebook is None and bare(ids).memory_logits is None


@pytest.mark.parametrize("base", ["llama", "mamba"])
@torch.no_grad()
def test_generate_equals_an_uncached_loop_and_beams_agree(base):
    model = adapter(base)
    prompt = repeated_text(length=20)
    generated = model.generate(prompt, max_new_tokens=10, do_sample=False, eos_token_id=None)  # the loop never stops
    sequence = prompt
    for _ in range(10):
        next_id = model(sequence, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        sequence = torch.cat([sequence, next_id], dim=1)
    assert torch.equal(generated, sequence)
    beams = dict(max_new_tokens=8, num_beams=3, do_sample=False, eos_token_id=None)
    assert torch.equal(model.generate(prompt, **beams), model.generate(prompt, use_cache=False, **beams))


def test_configuration_errors_name_the_problem():
    with pytest.raises(ValueError, match="vocab_size"):
        NotebookAdapterConfig(base_config={**BASES["llama"], "vocab_size": 300})
    with pytest.raises(ValueError, match="model_type"):
        NotebookAdapterConfig(base_config={"hidden_size": 32})
    with pytest.raises(ValueError, match="memory"):
        NotebookAdapterConfig(base_config=BASES["llama"], notebook_config={"memory": "attention"})
    with pytest.raises(ValueError, match="needs a base_config"):
        NotebookAdapterConfig()
    model = adapter("llama")
    with pytest.raises(ValueError, match="NotebookAdapterCache"):
        model(repeated_text(), cache=object())
    cache = model(repeated_text(batch=2)).cache
    with pytest.raises(ValueError, match="holds 2 sequences"):
        model(repeated_text(batch=3), cache=cache)
    from modeling_kathleen_notebook.session import NotebookSession

    with pytest.raises(ValueError, match="KathleenForCausalLM"):
        NotebookSession(model)


FRESH_LOAD = """
import sys, torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({folder!r}, trust_remote_code=True).eval()
assert "modeling_kathleen_notebook" not in sys.modules, "the package leaked into the remote-code process"
again = AutoModelForCausalLM.from_pretrained({folder!r})  # no flag: the remote config registered its type
assert type(again) is type(model), type(again)
ids = torch.tensor({ids})
with torch.no_grad():
    save_file({{"logits": model(ids, use_cache=False).logits,
                "generated": model.generate(ids, max_new_tokens=8, do_sample=False)}}, "out.safetensors")
print(type(model).__name__, type(model.trunk).__name__)
"""


@pytest.mark.parametrize("base", ["llama", "mamba"])
@torch.no_grad()
def test_save_and_load_in_a_fresh_offline_process(base, tmp_path):
    model = adapter(base, seed=3)
    folder = tmp_path / "checkpoint"
    model.save_pretrained(folder)
    ids = repeated_text(length=24)
    stdout = run_fresh_python(FRESH_LOAD.format(folder=str(folder), ids=ids.tolist()), cwd=tmp_path)
    assert stdout.split() == ["NotebookAdapterForCausalLM", type(model.trunk).__name__]
    got = load_file(tmp_path / "out.safetensors")
    assert torch.equal(got["logits"], model(ids, use_cache=False).logits)
    assert torch.equal(got["generated"], model.generate(ids, max_new_tokens=8, do_sample=False))
    again = NotebookAdapterForCausalLM.from_pretrained(folder).eval()
    assert torch.equal(again(ids).logits, model(ids).logits)


@torch.no_grad()
def test_left_padded_batch_generates_what_each_row_does_alone():
    model = adapter("llama", seed=5)
    rows = [repeated_text(1, 24)[0], repeated_text(1, 16)[0, :11]]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]) for r in rows]).long()
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    for i, row in enumerate(rows):
        alone = model.generate(row[None], max_new_tokens=8, do_sample=False)
        assert torch.equal(batch[i, width:], alone[0, len(row):])


def test_adapter_config_saved_before_fourier_period_loads_with_the_old_period(tmp_path):
    """As for KathleenConfig: a saved notebook_config without fourier_period has the vocabulary-size period."""
    import json

    torch.manual_seed(0)
    config = NotebookAdapterConfig(base_config=BASES["llama"], notebook_config={**NOTEBOOK, "fourier_period": 259})
    model = NotebookAdapterForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["notebook_config"]["fourier_period"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = NotebookAdapterForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.notebook_config.fourier_period == 259
    ids = repeated_text()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


@torch.no_grad()
def test_return_dict_none_follows_the_config():
    """As KathleenForCausalLM (PEFT passes return_dict=None): an output by default, a tuple when
    config.return_dict is False, whatever the base model's own setting."""
    model, ids = adapter("llama"), repeated_text()
    assert model(ids, labels=ids, return_dict=None).loss.ndim == 0
    model.config.return_dict = False
    as_tuple = model(ids, labels=ids)
    assert isinstance(as_tuple, tuple) and as_tuple[0].ndim == 0
    assert not isinstance(model(ids, return_dict=True), tuple)


@pytest.mark.parametrize("base", BASES)
@torch.no_grad()
def test_cache_saved_to_disk_continues_like_the_live_one(base, tmp_path):
    """The adapter's cache (base model's cache + notebook) written to a file and read back continues decoding
    exactly as the live cache does; another config's file and a truncated file are refused."""
    from modeling_kathleen_notebook import NotebookAdapterCache

    model, ids = adapter(base), repeated_text()
    cache = model(ids[:, :30]).cache
    cache.save(tmp_path / "cache.safetensors", model.config)
    loaded = NotebookAdapterCache.load(tmp_path / "cache.safetensors", model.config)
    live, again = cache, loaded
    for t in range(30, 40):
        a, b = model(ids[:, t:t + 1], cache=live), model(ids[:, t:t + 1], cache=again)
        torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=1e-6)
        live, again = a.cache, b.cache
    assert loaded.get_seq_length() == 40
    other = adapter(base, seed=1)
    other.config.notebook_config.hrr_dim = 512
    with pytest.raises(ValueError, match="another config"):
        NotebookAdapterCache.load(tmp_path / "cache.safetensors", other.config)
    data = (tmp_path / "cache.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        NotebookAdapterCache.load(tmp_path / "cut.safetensors", model.config)


@torch.no_grad()
def test_a_read_trust_on_the_adapter_acts_alike_step_by_step_and_in_full():
    torch.manual_seed(0)
    config = NotebookAdapterConfig(base_config=BASES["llama"], notebook_config={**NOTEBOOK, "read_trust": True})
    model = NotebookAdapterForCausalLM(config).eval()
    model.notebook.trust.weights.copy_(torch.tensor([1.0, 0.5, 0.5, 0.2, -0.5, 0.0]))  # loud, so it matters
    ids = repeated_text()
    full = model(ids, use_cache=False)
    out, pieces = model(ids[:, :19]), []
    pieces.append(out.logits)
    for t in range(19, ids.shape[1]):
        out = model(ids[:, t:t + 1], cache=out.cache)
        pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(model(ids, use_cache=False, logits_to_keep=1).logits, full.logits[:, -1:])
    untrusted, _ = model.notebook(ids, torch.ones_like(ids, dtype=torch.bool), trunk_logits=full.trunk_logits)
    assert (full.memory_logits - untrusted).abs().max() > 0.1  # control: the trust does act


@pytest.fixture
def adapter_crops(monkeypatch):
    """The number of bytes each crop of an adapter's cache dropped."""
    return count_crops(monkeypatch, NotebookAdapterCache)


@torch.no_grad()
def test_an_adapter_on_an_attention_model_goes_back_to_the_state_of_a_cache_that_never_read_the_dropped_bytes():
    model = adapter("llama", seed=5)
    ids = repeated_text(1, 64)
    cache = model.new_cache()
    cache.activate_past_recording(recurrent_states_to_keep=4)
    model(ids[:, :40], cache=cache)
    model(ids[:, 40:43], cache=cache)
    cache.crop(-4)
    assert cache.seen_tokens == 39 and cache.base.get_seq_length() == 39
    shorter = model(ids[:, :39]).cache
    assert torch.equal(cache.notebook.tail, shorter.notebook.tail)
    torch.testing.assert_close(cache.notebook.spectrum, shorter.notebook.spectrum, rtol=0, atol=1e-4)
    after = model(ids[:, 39:41], cache=cache).logits  # and reads on as if it had never read them
    torch.testing.assert_close(after, model(ids[:, :41]).logits[:, -2:], rtol=0, atol=1e-4)


@pytest.mark.parametrize("drafts", ["prompt lookup", "assistant model"])
@torch.no_grad()
def test_an_adapter_on_an_attention_model_decodes_with_drafts_to_its_greedy_bytes(drafts, adapter_crops):
    model = adapter("llama", seed=5)
    prompt = repeated_text(1, 64)
    drafting = dict(prompt_lookup_num_tokens=4) if drafts == "prompt lookup" else dict(
        assistant_model=adapter("llama", seed=6))
    greedy = model.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None)
    drafted = model.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None, **drafting)
    assert torch.equal(drafted, greedy)
    assert any(dropped > 0 for dropped in adapter_crops)  # drafts were rejected: the cache went back over bytes


@torch.no_grad()
def test_an_adapter_on_a_recurrent_model_refuses_drafts_with_transformers_message():
    """Its base model's cache cannot drop rows: Transformers' own refusal after the prompt, nothing wrong."""
    model = adapter("mamba")
    with pytest.raises(ValueError, match="cache that can be cropped"):
        model.generate(repeated_text(1, 32), max_new_tokens=5, do_sample=False, prompt_lookup_num_tokens=3)
