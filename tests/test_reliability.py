"""Hostile input, long streams, half precision, crash-safe files, safetensors only, determinism."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tiny_model
from modeling_kathleen_notebook import KathleenCache, KathleenForCausalLM
from modeling_kathleen_notebook.record import trace
from modeling_kathleen_notebook.scoring import byte_bits
from modeling_kathleen_notebook.session import NotebookSession
from modeling_kathleen_notebook.tokenization_kathleen import byte_tokenizer, bytes_to_ids, ids_to_bytes

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MODEL = tiny_model(std=0.3)
TOKENIZER = byte_tokenizer()
SPECIAL_TEXT = st.sampled_from(["</s>", "<pad>", "<unk>", "\x00", "\r\n", "\x1b[0m", "\ufeff", "é", "😀"])


@SETTINGS
@given(st.lists(st.one_of(st.text(max_size=20), SPECIAL_TEXT), max_size=8))
def test_tokenizer_is_exact_on_any_text(pieces):
    text = "".join(pieces)
    ids = TOKENIZER(text)["input_ids"]
    assert ids == [b + 3 for b in text.encode()]  # special-token text stays bytes; nothing appended
    assert TOKENIZER.decode(ids) == text


@SETTINGS
@given(st.binary(max_size=200))
def test_any_bytes_roundtrip_and_score(data):
    assert ids_to_bytes(bytes_to_ids(data)) == data
    if data:
        bits = byte_bits(MODEL, bytes_to_ids(data), chunk_size=17)
        assert bits.shape == (len(data),) and torch.isfinite(bits).all()
    text = TOKENIZER.decode(bytes_to_ids(data).tolist())
    assert isinstance(text, str)  # invalid UTF-8 becomes U+FFFD, never an exception


@SETTINGS
@given(st.lists(st.integers(min_value=-3, max_value=300), min_size=0, max_size=60),
       st.sampled_from([torch.long, torch.int32, torch.float32, torch.bool]))
def test_forward_works_or_raises_value_error(ids, dtype):
    tensor = torch.tensor([ids], dtype=dtype) if ids else torch.zeros(1, 0, dtype=dtype)
    valid = bool(ids) and dtype in (torch.long, torch.int32) and all(0 <= i < 259 for i in ids)
    if not valid:
        with pytest.raises(ValueError):
            MODEL(tensor)
        return
    with torch.no_grad():
        out = MODEL(tensor)
    assert out.logits.shape == (1, len(ids), 259) and torch.isfinite(out.logits).all()


@SETTINGS
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6))
def test_any_chunking_of_a_stream_equals_one_forward(sizes):
    ids = torch.randint(3, 259, (2, sum(sizes)), generator=torch.Generator().manual_seed(sum(sizes)))
    with torch.no_grad():
        full = MODEL(ids).logits
        cache, parts, start = None, [], 0
        for size in sizes:
            out = MODEL(ids[:, start:start + size], cache=cache)
            cache, start = out.cache, start + size
            parts.append(out.logits)
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-4)


def test_mismatched_shapes_raise_value_errors():
    ids = torch.randint(3, 259, (2, 5))
    for bad in (dict(attention_mask=torch.ones(3, 5)), dict(attention_mask=torch.ones(2, 4)),
                dict(write_mask=torch.ones(2, 4)), dict(labels=torch.ones(2, 4, dtype=torch.long))):
        with pytest.raises(ValueError):
            MODEL(ids, **bad)
    for label in (259, -5):  # out of the vocabulary (torch would raise an IndexError or a CUDA assert)
        with pytest.raises(ValueError, match=f"labels must be token ids in \\[0, 259\\) or -100 .*got {label}"):
            MODEL(ids, labels=torch.cat([ids[:, :-1], torch.full_like(ids[:, -1:], label)], 1))
    ignored = torch.full_like(ids, -100)  # every label ignored: no error (the loss is nan, as in Transformers)
    MODEL(ids, labels=ignored)


@SETTINGS
@given(st.binary(min_size=30, max_size=300), st.data())
def test_memory_api_on_random_bytes(data, draw):
    session = NotebookSession(MODEL)
    session.read(data)
    start = draw.draw(st.integers(0, len(data) - 2))
    end = draw.draw(st.integers(start + 1, len(data)))
    session.unlearn(span=(start, end))
    whole = session.contributions([(0, len(session.ids))])[0]
    memory = session.cache.memory.spectrum[0]
    assert torch.isfinite(torch.view_as_real(memory)).all()
    assert (memory - whole).abs().max() <= 1e-5 * max(1.0, whole.abs().max().item())
    summary = session.summary()
    assert all(math.isfinite(v) for v in summary.values())


# ---- long streams: bounded state ---------------------------------------------------------------

STREAM = 1_000_000


def random_text(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3 + 97, 3 + 123, (n,), generator=g)  # lowercase letters


@pytest.mark.parametrize("forgetting", [True, False])
def test_million_byte_stream_stays_finite_and_bounded(forgetting):
    """With forgetting, ‖mem‖ ≤ max‖w‖ / g (each step: ‖M‖ ≤ (1 - gβ)‖M‖ + β‖w‖); without, ‖mem‖ ≤ Σβ‖w‖."""
    model = tiny_model(forgetting=forgetting, d_model=16, n_layers=1, hrr_dim=64)
    ids = random_text(STREAM).unsqueeze(0)
    cache, betas = None, 0.0
    with torch.no_grad():
        for start in range(0, STREAM, 16384):
            part = ids[:, start:start + 16384]
            traced, _ = trace(model.model.memory, part, torch.ones_like(part, dtype=torch.bool),
                                                None if cache is None else cache.memory)
            betas += traced.beta.sum().item()
            out = model(part, cache=cache)
            cache = out.cache
            assert torch.isfinite(out.logits).all()
    for state in cache.trunk:
        assert torch.isfinite(state.integrator).all() and state.integrator.abs().max() < 1e3
    norm = torch.fft.irfft(cache.memory.spectrum[0], n=64).norm().item()
    # ‖w‖ = ‖key‖ · ‖cv‖ for the unitary Fourier values: exactly 1
    if forgetting:
        assert norm <= 1.0 / model.model.memory.forget_rate().item() + 1e-3
    else:
        assert norm <= betas + 1e-3
        assert norm > math.sqrt(betas) * 0.01  # it does grow: the documented price of not forgetting
    bits = byte_bits(model, ids[0, :STREAM], chunk_size=65536)  # the streaming scorer on the same stream
    assert torch.isfinite(bits).all()


def test_generation_style_stepping_stays_finite():
    """Byte-by-byte stepping (T = 1 calls) over 20,000 bytes; scripts/soak.py runs 1,000,000."""
    model = tiny_model(d_model=16, n_layers=1, hrr_dim=64)
    ids = random_text(20_000).unsqueeze(0)
    cache = None
    with torch.no_grad():
        for t in range(ids.shape[1]):
            out = model(ids[:, t:t + 1], cache=cache)
            cache = out.cache
        assert torch.isfinite(out.logits).all()
    assert cache.get_seq_length() == 20_000


# ---- half precision --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 0.05), (torch.float16, 0.01)])
def test_half_precision_agrees_with_fp32(tmp_path, dtype, tolerance):
    """Logits within `tolerance` x max |logit| of fp32; identical greedy bytes for a short prompt."""
    model = tiny_model(seed=1, std=0.3)
    model.save_pretrained(tmp_path)
    half = KathleenForCausalLM.from_pretrained(tmp_path, dtype=dtype).eval()
    prompt = torch.tensor([[10, 20, 30, 40, 50, 60, 70]])
    with torch.no_grad():
        full, low = model(prompt), half(prompt)
    assert (full.logits - low.logits.float()).abs().max() <= tolerance * full.logits.abs().max()
    assert low.cache.trunk[0].integrator.dtype == torch.float32
    kwargs = dict(max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert torch.equal(model.generate(prompt, **kwargs), half.generate(prompt, **kwargs))


# ---- files: crash-safe, safetensors only, tensors named ------------------------------------------

SAVER = """
import sys, torch
from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
folder, memory = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = KathleenForCausalLM(KathleenConfig(d_model=64, n_layers=2)).eval()
cache = model(torch.randint(3, 259, (4, 64))).cache
print("ready", flush=True)
while True:
    model.save_pretrained(folder)
    cache.save(memory)
"""


def test_sigkill_during_saves_leaves_loadable_files(tmp_path):
    folder, memory = tmp_path / "model", tmp_path / "memory.safetensors"
    for attempt in range(5):
        process = subprocess.Popen([sys.executable, "-c", SAVER, str(folder), str(memory)], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL)
        assert process.stdout.readline().strip() == b"ready"
        time.sleep(0.5 + 0.37 * attempt)  # several saves in, at a different moment each time
        process.send_signal(signal.SIGKILL)
        process.wait()
        model = KathleenForCausalLM.from_pretrained(folder)
        cache = KathleenCache.load(memory, model.config)
    leftover = tmp_path / ".saving-memory.safetensors-killed"  # as a kill inside a save leaves it
    leftover.mkdir()
    (leftover / "memory.safetensors").write_bytes(b"half a save")
    cache.save(memory)  # a kill may land inside the last cache save: the next save clears its leftovers
    assert not list(tmp_path.glob(".saving-*"))  # the cache's staging files never outlive a finished save


def test_only_safetensors_are_ever_read(tmp_path):
    from safetensors.torch import load_file

    model = tiny_model()
    model.save_pretrained(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".bin", ".pt", ".pkl", ".pth")]
    weights = load_file(tmp_path / "model.safetensors")
    os.remove(tmp_path / "model.safetensors")
    torch.save(weights, tmp_path / "pytorch_model.bin")  # a pickle: must never be unpickled
    with pytest.raises(OSError, match="model.safetensors"):
        KathleenForCausalLM.from_pretrained(tmp_path)
    package = Path(__file__).resolve().parents[1] / "modeling_kathleen_notebook"
    for source in package.glob("*.py"):
        text = source.read_text()
        assert "torch.load(" not in text and "import pickle" not in text, source.name


def test_shape_mismatch_names_the_tensor(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["d_model"] = 32
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"lm_head.weight: checkpoint \(259, 24\) vs config \(259, 32\)"):
        KathleenForCausalLM.from_pretrained(tmp_path)



def test_a_config_that_builds_other_blocks_than_the_weights_is_refused(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    blocks = model.config.n_layers
    for n_layers, effect in ((blocks - 1, "drop 1 trained one"), (blocks + 1, "leave 1 new one\\(s\\) untrained")):
        with pytest.raises(ValueError, match=f"config.json with n_layers={n_layers}: the checkpoint holds {blocks} "
                                             f"model.trunk.blocks where the config builds {n_layers}: .*{effect}"):
            KathleenForCausalLM.from_pretrained(tmp_path, n_layers=n_layers)
    with pytest.raises(ValueError, match=r"config.json with d_model=32: lm_head.weight: checkpoint \(259, 24\) vs "
                                         r"config \(259, 32\)"):
        KathleenForCausalLM.from_pretrained(tmp_path, d_model=32)
    # controls: the checkpoint's own config loads, and so does a deliberate choice that keeps every block
    loaded, info = KathleenForCausalLM.from_pretrained(tmp_path, n_layers=blocks, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.tensor([[5, 6, 7]])
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    trunk = KathleenForCausalLM.from_pretrained(tmp_path, memory="none")  # the bare trunk, its memory left out
    assert trunk.config.memory == "none" and len(trunk.model.trunk.blocks) == blocks
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layers": blocks - 1}))
    with pytest.raises(ValueError, match=f"do not fit its config.json: the checkpoint holds {blocks} "):
        KathleenForCausalLM.from_pretrained(tmp_path)


# ---- determinism -------------------------------------------------------------------------------------


def test_same_seed_same_training_and_same_samples():
    def run():
        model = tiny_model(seed=5)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = torch.randint(3, 259, (4, 64), generator=torch.Generator().manual_seed(5))
        for _ in range(5):
            model(data, labels=data).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        torch.manual_seed(9)
        sample = model.generate(data[:1, :8], do_sample=True, max_new_tokens=30, eos_token_id=None)
        return model.state_dict(), sample

    (weights_a, sample_a), (weights_b, sample_b) = run(), run()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert torch.equal(sample_a, sample_b)


@pytest.mark.parametrize("kind", ["kathleen", "adapter"])
def test_resizing_the_vocabulary_is_refused_and_changes_nothing(kind):
    """Bytes need no new tokens, and the notebook has a row per id: another size is a clear error that leaves the
    model as it was (Transformers' own resize would swap the embeddings and break the notebook); the size the
    model has is a no-op that returns the embeddings, as Transformers' does."""
    from test_adapter import adapter

    model = MODEL if kind == "kathleen" else adapter("llama")
    ids = torch.randint(3, 259, (1, 12), generator=torch.Generator().manual_seed(0))
    before = model(ids).logits
    embeddings = model.get_input_embeddings()
    for bad in (dict(new_num_tokens=300), dict(new_num_tokens=259, pad_to_multiple_of=64)):
        with pytest.raises(ValueError, match="vocabulary is fixed at 259"):
            model.resize_token_embeddings(**bad)
    assert model.resize_token_embeddings(259) is embeddings and model.resize_token_embeddings() is embeddings
    assert model.get_input_embeddings() is embeddings and model.config.vocab_size == 259
    torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)
