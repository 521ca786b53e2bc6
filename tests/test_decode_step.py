"""The compiled decoding step (decode_step.py, kernels.cpp's `decode_step`) equals the PyTorch step it replaces and
the full forward (fp32, 1e-4), for every notebook variant it covers; where it does not apply, the PyTorch step runs."""

import copy
import os
import pickle
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import modeling_kathleen_notebook.modeling_kathleen as modeling
from conftest import tiny_model
from modeling_kathleen_notebook.kernels import fourier_kernels

SHIPPED_RECIPE = dict(key_binding="bind", write_signal="surprise", forgetting=False)
VARIANTS = {
    "[KR]'s notebook (the tests' tiny config)": {},
    "bound keys, surprise (the shipped recipe's write rule)": SHIPPED_RECIPE,
    "bound keys over 16 bytes, surprise, forgetting (the shipped checkpoint)": dict(SHIPPED_RECIPE, key_window=16,
                                                                                     forgetting=True),
    "bound keys, gate + surprise, forgetting": dict(key_binding="bind", write_signal="gate+surprise"),
    "shipped recipe with a read trust": dict(SHIPPED_RECIPE, read_trust=True),
    "repeat bank, one trust of the sum": dict(SHIPPED_RECIPE, key_window=16, forgetting=True, read_trust=True,
                                              repeat_key_window=4),
    "repeat bank, a read trust per memory": dict(SHIPPED_RECIPE, key_window=16, forgetting=True, read_trust=True,
                                                 repeat_key_window=4, repeat_read_trust=True),
    "no memory": dict(memory="none"),
    "three blocks, kernel 3": dict(n_layers=3, conv_kernel=3, hrr_dim=512),
    # the read's FFT at other periods than the default 288: a saved legacy config's 259 = 7 x 37, and a prime
    "Fourier period 259": dict(fourier_period=259),
    "Fourier period 263 (prime)": dict(fourier_period=263),
}


def loud_model(**overrides):
    """A tiny model with large-variance weights and a loud memory (read scale 8; read trusts as fitted for the
    shipped checkpoint, several nats on a sure read, crosstalk capped at 0.05), so that a wrong read would show."""
    model = tiny_model(std=0.3, **overrides)
    if model.config.memory == "notebook":
        with torch.no_grad():
            model.model.memory.read_scale.fill_(8.0)
            for trust in filter(None, (model.model.memory.trust, model.model.memory.repeat_trust)):
                trust.weights.copy_(torch.tensor([6.4, -3.7, 0.7, -0.15, 0.14, -0.28]))
                trust.threshold.fill_(2.6)
                trust.log_noise_cap.fill_(-3.0)
    return model


def repeated_text(batch: int = 2, length: int = 240, seed: int = 0) -> torch.Tensor:
    """Rows of a random 40-byte phrase said again and again: the memory's reads hit, so its logits matter."""
    g = torch.Generator().manual_seed(seed)
    phrase = torch.randint(3, 259, (batch, 40), generator=g)
    return phrase.repeat(1, length // 40 + 1)[:, :length]


@pytest.fixture
def spy(monkeypatch):
    """Records, for each one-byte call of the model, whether the compiled step ran."""
    calls = []
    real = modeling.KathleenForCausalLM.fused_decoding

    def recorded(self, input_ids, *args):
        result = real(self, input_ids, *args)
        if input_ids.shape[1] == 1:
            calls.append(result is not None)
        return result

    monkeypatch.setattr(modeling.KathleenForCausalLM, "fused_decoding", recorded)
    return calls


def decode(model, ids, prefix: int):
    """Logits of every position after `prefix`, one byte per call after a prefill, and the cache."""
    with torch.no_grad():
        cache = model(ids[:, :prefix]).cache
        steps = [model(ids[:, t:t + 1], cache=cache) for t in range(prefix, ids.shape[1])]
    return torch.cat([s.logits for s in steps], dim=1), torch.cat([s.memory_logits for s in steps], dim=1) \
        if steps[0].memory_logits is not None else None, cache


@pytest.mark.parametrize("batch", [2, 5])  # 5 rows: the trunk's linear layers as products over the rows
@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_step_equals_the_full_forward_and_the_pytorch_step(variant, batch, spy, monkeypatch):
    assert fourier_kernels() is not None, "the CPU kernels did not build (see the log): a compiler and ninja?"
    model = loud_model(**VARIANTS[variant])
    ids = repeated_text(batch=batch)
    with torch.no_grad():
        full = model(ids)
    compiled, compiled_memory, compiled_cache = decode(model, ids, 100)
    assert spy and all(spy), "the compiled step did not run"
    torch.testing.assert_close(compiled, full.logits[:, 100:], rtol=0, atol=1e-4)

    spy.clear()
    monkeypatch.setenv("KATHLEEN_FUSED_DECODE", "0")
    stepped, stepped_memory, stepped_cache = decode(model, ids, 100)
    assert spy and not any(spy)
    torch.testing.assert_close(compiled, stepped, rtol=0, atol=1e-4)
    for name, tensor in stepped_cache.state_tensors().items():
        torch.testing.assert_close(compiled_cache.state_tensors()[name], tensor, rtol=0, atol=1e-4, msg=name)
    if stepped_memory is not None:  # control: the memory's share is large enough that a wrong read would show
        assert compiled_memory.abs().amax() > 1.0
        torch.testing.assert_close(compiled_memory, stepped_memory, rtol=0, atol=1e-4)


def test_a_wrong_memory_is_caught():
    """Negative control: the same comparison fails when the compiled step starts from a memory it did not read."""
    model = loud_model()
    ids = repeated_text()
    with torch.no_grad():
        full = model(ids).logits
        cache = model(ids[:, :100]).cache
        cache.memory.spectrum = cache.memory.spectrum * 0.5
        wrong = torch.cat([model(ids[:, t:t + 1], cache=cache).logits for t in range(100, 140)], dim=1)
    assert (wrong - full[:, 100:140]).abs().amax() > 1e-2


REPEAT_BANK = VARIANTS["repeat bank, a read trust per memory"]


def step_logits(model, cache, byte: torch.Tensor, compiled: bool, monkeypatch) -> torch.Tensor:
    """The logits of one byte [B, 1] read into a copy of `cache` with a copy of its key memo (which a deepcopy
    drops), by the compiled step or the PyTorch step."""
    monkeypatch.setenv("KATHLEEN_FUSED_DECODE", "1" if compiled else "0")
    copied = copy.deepcopy(cache)
    assert copied.key_memo is None
    copied.key_memo = cache.key_memo and (cache.key_memo[0], [t.clone() for t in cache.key_memo[1]])
    with torch.no_grad():
        return model(byte, cache=copied).logits


def test_a_byte_reads_its_write_key_from_the_key_memo_only_where_its_ids_match(spy, monkeypatch):
    """Each memory's last read key is kept (kernels.cpp's KeyMemo) and is the next byte's write key: garbage in the
    memo's keys changes the next byte where the ids say it is that key (so the memo is read: the control), and
    nothing where they do not."""
    model = loud_model(**REPEAT_BANK)
    ids = repeated_text()
    *_, cache = decode(model, ids[:, :120], 100)
    assert spy and all(spy)
    made_from, memo = cache.key_memo
    assert made_from() is model.model.memory.tables() and len(memo) == 4  # ids and keys for each memory
    expected = step_logits(model, cache, ids[:, 120:121], compiled=False, monkeypatch=monkeypatch)
    torch.testing.assert_close(step_logits(model, cache, ids[:, 120:121], True, monkeypatch), expected,
                               rtol=0, atol=1e-4)
    for memo_keys in memo[1::2]:
        memo_keys.normal_(generator=torch.Generator().manual_seed(0))
    assert (step_logits(model, cache, ids[:, 120:121], True, monkeypatch) - expected).abs().amax() > 1e-2
    for memo_ids in memo[::2]:
        memo_ids.fill_(-1)
    torch.testing.assert_close(step_logits(model, cache, ids[:, 120:121], True, monkeypatch), expected,
                               rtol=0, atol=1e-4)


def test_the_key_memo_survives_reordered_rows(spy):
    """Rows swapped in place (beam search) keep the memo's tensors, whose ids then no longer match each row's
    window: the compiled bytes still equal the full forward."""
    model = loud_model(**REPEAT_BANK)
    ids = repeated_text(seed=3)
    with torch.no_grad():
        cache = model(ids[:, :100]).cache
        for t in range(100, 110):
            model(ids[:, t:t + 1], cache=cache)
        memo = cache.key_memo[1]
        cache.reorder_cache(torch.tensor([1, 0]))
        swapped = ids.flip(0)
        steps = [model(swapped[:, t:t + 1], cache=cache).logits for t in range(110, 130)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(swapped).logits[:, 110:130], rtol=0, atol=1e-4)
    assert cache.key_memo[1] is memo and spy and all(spy)


def test_a_key_memo_of_other_key_tables_is_not_read(spy, monkeypatch):
    """A memo formed from key tables since rebuilt (changed buffers; another model's) is made anew, though its ids
    match the next window; the control, a memo made to look current, changes the byte."""
    model = loud_model(**REPEAT_BANK)
    ids = repeated_text(seed=4)
    with torch.no_grad():
        cache = model(ids[:, :99]).cache
        model(ids[:, 99:100], cache=cache)  # its memo: the keys of the windows ending at byte 99
        old_memo = cache.key_memo[1]
        frequencies = model.model.memory.key_frequencies
        frequencies.copy_(frequencies.roll(1, dims=1))
        cache = model(ids[:, :100]).cache
    expected = step_logits(model, cache, ids[:, 100:101], compiled=False, monkeypatch=monkeypatch)
    cache.key_memo = (weakref.ref(frequencies), old_memo)  # formed from something else than today's tables
    torch.testing.assert_close(step_logits(model, cache, ids[:, 100:101], True, monkeypatch), expected,
                               rtol=0, atol=1e-4)
    cache.key_memo = (weakref.ref(model.model.memory.tables()), old_memo)
    assert (step_logits(model, cache, ids[:, 100:101], True, monkeypatch) - expected).abs().amax() > 1e-2
    assert spy == [True, False, True, True]  # the byte that made the memo, the PyTorch step, the two compiled


def test_batch_of_three_with_continued_cache_and_generate(spy, monkeypatch):
    """generate's own loop over the compiled step (its compiled greedy loop off: test_greedy_generation.py)."""
    monkeypatch.setenv("KATHLEEN_FUSED_GENERATE", "0")
    model = loud_model(eos_token_id=None)
    prompt = repeated_text(batch=3, length=60, seed=1)
    with torch.no_grad():
        compiled = model.generate(prompt, max_new_tokens=30, do_sample=False)
    assert spy and all(spy[1:])
    monkeypatch.setenv("KATHLEEN_FUSED_DECODE", "0")
    with torch.no_grad():
        stepped = model.generate(prompt, max_new_tokens=30, do_sample=False)
    assert torch.equal(compiled, stepped)


def test_a_cache_that_decoded_pickles_without_its_key_memo_and_goes_on_alike(spy):
    model = loud_model(**REPEAT_BANK)
    ids = repeated_text(seed=5)
    *_, cache = decode(model, ids[:, :110], 100)
    assert cache.key_memo is not None
    twin = pickle.loads(pickle.dumps(cache))
    assert twin.key_memo is None
    with torch.no_grad():
        for t in range(110, 120):
            torch.testing.assert_close(model(ids[:, t:t + 1], cache=twin).logits,
                                       model(ids[:, t:t + 1], cache=cache).logits, rtol=0, atol=1e-4)
    assert twin.key_memo is not None and spy and all(spy)


def test_a_model_that_decoded_can_be_copied_and_pickled(spy, monkeypatch):
    """The compiled step's cache of a model's weights holds the kernels' module, which copy and pickle cannot take:
    a copy starts without it (and lists its own weights at its first byte), so deepcopy, pickle and a session's copy
    work after generating, and the copy generates the same bytes through its own compiled step."""
    if fourier_kernels() is None:
        pytest.skip("no compiled kernels here: nothing holds a module")
    monkeypatch.setenv("KATHLEEN_FUSED_GENERATE", "0")  # generate's loop over the step, which the spy sees
    model = loud_model(eos_token_id=None)
    prompt = repeated_text(batch=2, length=50, seed=3)
    with torch.no_grad():
        first = model.generate(prompt, max_new_tokens=12, do_sample=False)
    assert spy and all(spy[1:]) and model.__dict__["_decode_weights"].kernels is not None  # the cache holds it
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert "_decode_weights" not in twin.__dict__ or twin.__dict__["_decode_weights"] is None
        spy.clear()
        with torch.no_grad():
            assert torch.equal(twin.generate(prompt, max_new_tokens=12, do_sample=False), first)
        assert spy and all(spy[1:])  # the copy's own compiled step
        assert twin.__dict__["_decode_weights"].trunk[0] is not model.__dict__["_decode_weights"].trunk[0]


def test_a_wide_batch_takes_the_compiled_step_and_agrees(spy):
    """40 rows (the trunk's linear layers as products over the rows, kernels.cpp's linear_rows): the compiled step at
    every byte, equal to the full forward and, row by row, to the same rows decoded alone (one row at a time)."""
    model = loud_model()
    wide = repeated_text(batch=40, length=70, seed=2)
    with torch.no_grad():
        full = model(wide).logits
        stepped, _, _ = decode(model, wide, prefix=60)
        alone, _, _ = decode(model, wide[7:8], prefix=60)
    assert len(spy) == 20 and all(spy)
    torch.testing.assert_close(stepped, full[:, 60:], atol=1e-4, rtol=0)
    torch.testing.assert_close(alone, stepped[7:8], atol=1e-4, rtol=0)


def test_where_it_does_not_apply_the_pytorch_step_runs(spy):
    """Padding in the step, hidden states asked for, autograd on, training mode: each a PyTorch step."""
    model = loud_model()
    ids = repeated_text()
    asks = [dict(attention_mask=torch.tensor([[1], [0]])), dict(output_hidden_states=True)]
    with torch.no_grad():
        for ask in asks:
            assert model(ids[:, 100:101], cache=model(ids[:, :100]).cache, **ask).logits.shape == (2, 1, 259)
    model(ids[:, 100:101], cache=model(ids[:, :100]).cache)
    model.train()
    with torch.no_grad():
        model(ids[:, 100:101], cache=model(ids[:, :100]).cache)
    assert spy == [False] * 4


def test_a_layer_put_in_place_or_a_hook_turns_it_off(spy):
    """A wrapper in a layer's place (what PEFT's LoRA does) and a hook registered after the first compiled step both
    send decoding back to the PyTorch ops, which run them; the result still equals the full forward."""

    class Doubled(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return 2 * self.inner(x)

    model = loud_model()
    ids = repeated_text()
    decode(model, ids, 230)
    assert spy and all(spy)
    spy.clear()
    seen = []
    handle = model.model.trunk.blocks[0].ffn_in.register_forward_hook(lambda *_: seen.append(1))
    decode(model, ids, 230)
    assert spy and not any(spy) and seen
    handle.remove()
    spy.clear()
    block = model.model.trunk.blocks[1]
    block.value_proj = Doubled(block.value_proj)
    with torch.no_grad():
        full = model(ids).logits
    compiled, _, _ = decode(model, ids, 230)
    assert spy and not any(spy)
    torch.testing.assert_close(compiled, full[:, 230:], rtol=0, atol=1e-4)


def test_a_cast_model_falls_back(spy):
    """fp64 weights (a cast after the weights were listed, too): the PyTorch step, which equals the full forward."""
    model = loud_model()
    decode(model, repeated_text(), 236)
    model.double()
    ids = repeated_text()
    with torch.no_grad():
        full = model(ids).logits
    spy.clear()
    stepped, _, _ = decode(model, ids, 230)
    assert spy and not any(spy)
    torch.testing.assert_close(stepped, full[:, 230:], rtol=0, atol=1e-4)


def test_a_cast_and_back_reads_the_new_storage(spy):
    """.double().float() gives every parameter new storage: the compiled step reads it (a copy listed before the
    cast would keep the old values), here the read scale set after the round trip."""
    model = loud_model()
    ids = repeated_text()
    before, _, _ = decode(model, ids, 200)
    model.double().float()
    with torch.no_grad():
        model.model.memory.read_scale.fill_(3.0)
        full = model(ids).logits
    spy.clear()
    compiled, _, _ = decode(model, ids, 200)
    assert spy and all(spy)
    assert (before - full[:, 200:]).abs().amax() > 1e-1  # control: the new read scale shows in the logits
    torch.testing.assert_close(compiled, full[:, 200:], rtol=0, atol=1e-4)


def test_a_parameter_added_to_a_layer_is_noticed(spy):
    """A slot that gains an entry (a parameter registered on a layer after the first compiled step) lists the
    weights again; the result still equals the full forward."""
    model = loud_model()
    ids = repeated_text()
    decode(model, ids, 236)
    weights = model.__dict__["_decode_weights"]
    assert weights.current()  # control: nothing changed yet
    model.model.trunk.blocks[0].ffn_in.register_parameter("extra", nn.Parameter(torch.zeros(1)))
    assert not weights.current()
    with torch.no_grad():
        full = model(ids).logits
    compiled, _, _ = decode(model, ids, 230)
    assert model.__dict__["_decode_weights"] is not weights
    torch.testing.assert_close(compiled, full[:, 230:], rtol=0, atol=1e-4)


def test_bad_token_ids_in_a_step_are_refused_and_the_cache_kept():
    model = tiny_model()
    ids = repeated_text()
    with torch.no_grad():
        cache = model(ids[:, :100]).cache
        before = {name: t.clone() for name, t in cache.state_tensors().items()}
        with pytest.raises(ValueError, match="outside the vocabulary"):
            model(torch.tensor([[5], [300]]), cache=cache)
    for name, tensor in cache.state_tensors().items():
        assert torch.equal(tensor, before[name]), name


def test_a_foreign_or_wrongly_sized_cache_is_refused_in_a_step(spy):
    model, other = tiny_model(), tiny_model(d_model=30)
    ids = repeated_text()
    with torch.no_grad():
        own, foreign = model(ids[:, :100]).cache, other(ids[:, :100]).cache
        model(ids[:, 100:101], cache=own)  # the control: the model's own cache steps on
        with pytest.raises(ValueError, match="fingerprint"):
            model(ids[:, 100:101], cache=foreign)
        with pytest.raises(ValueError, match="holds 2 sequences"):
            model(ids[:1, 101:102], cache=own)
    assert spy == [True]  # the control ran compiled; the refusals raised before any step


def test_decode_latency_breakdown_times_the_compiled_step():
    """`scripts/decode_latency.py --breakdown` reports the parts of a compiled step, each inside the one before it;
    with the compiled step switched off it refuses to report (the control)."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "decode_latency.py"
    command = [sys.executable, str(script), "--breakdown", "--contexts", "64", "--rounds", "1"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    parts = dict(part.strip().rsplit(" ", 1) for part in line.split("ms per byte:")[1].split(","))
    call, step, kernel, inputs = (float(parts[name]) for name in ("model call", "fused step", "kernel",
                                                                 "notebook inputs"))
    assert call > step > kernel > 0 and step > inputs > 0
    off = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "KATHLEEN_FUSED_DECODE": "0"})
    assert off.returncode != 0 and "did not run" in off.stderr


@pytest.mark.parametrize("batch", [1, 3])
def test_decode_latency_times_generate_with_and_without_its_compiled_loop(batch):
    """`scripts/decode_latency.py --generate [--batch B]` reports ms per generated byte for both loops (and bytes/s of
    all rows for B > 1), having checked that the compiled one ran; with the compiled step switched off (and the loop
    with it) it refuses to report (the control), and a batch of 0 is refused."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "decode_latency.py"
    command = [sys.executable, str(script), "--generate", "--contexts", "64", "--rounds", "1", "--batch", str(batch)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    assert "generate, compiled loop" in line and "GenerationMixin's loop" in line
    assert ("bytes/s of all rows" in line) == (batch > 1) and f"batch {batch};" in done.stdout
    bad = subprocess.run([*command[:-1], "0"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--batch" in bad.stderr
    off = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "KATHLEEN_FUSED_DECODE": "0"})
    assert off.returncode != 0 and "did not run" in off.stderr
