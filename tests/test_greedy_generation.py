"""generate's greedy loop in one compiled call (greedy_generation.py, kernels.cpp's `decode_greedy`) gives what
GenerationMixin's own loop gives over the compiled step: the same bytes (eos, pad and max length included) and the
same cache; where a call needs more of that loop (sampling, logits processors, a streamer, scores), the loop runs."""

import pytest
import torch
from test_decode_step import VARIANTS, loud_model, repeated_text
from transformers import TextIteratorStreamer

import modeling_kathleen_notebook.greedy_generation as greedy_generation
from conftest import tiny_model
from modeling_kathleen_notebook.tokenization_kathleen import byte_tokenizer


@pytest.fixture
def loops(monkeypatch):
    """Counts the greedy_sample calls (the compiled loop) and the model's one-byte forwards (GenerationMixin's)."""
    counts = {"compiled loops": 0, "one-byte forwards": 0}
    real_sample = greedy_generation.greedy_sample

    def counted_sample(*args, **kwargs):
        counts["compiled loops"] += 1
        return real_sample(*args, **kwargs)

    monkeypatch.setattr(greedy_generation, "greedy_sample", counted_sample)
    return counts


def generate_both(model, prompt, monkeypatch, **kwargs):
    """generate with the compiled loop, then with GenerationMixin's (the compiled step still on in both), each
    from a fresh cache of its own: (sequences, cache) for each."""
    results = []
    for loop in ("1", "0"):
        monkeypatch.setenv("KATHLEEN_FUSED_GENERATE", loop)
        cache = model.new_cache()
        with torch.no_grad():
            out = model.generate(prompt, cache=cache, do_sample=False, **kwargs)
        results.append((out, cache))
    monkeypatch.delenv("KATHLEEN_FUSED_GENERATE")
    return results


def assert_same_cache(a, b):
    assert a.seen_tokens == b.seen_tokens
    for name, tensor in b.state_tensors().items():
        torch.testing.assert_close(a.state_tensors()[name], tensor, rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_compiled_loop_gives_generate_its_own_bytes_and_cache(variant, loops, monkeypatch):
    model = loud_model(**VARIANTS[variant], eos_token_id=None)
    prompt = repeated_text(batch=5, length=90, seed=2)  # 5 rows: the trunk's linear layers as products over the rows
    (compiled, compiled_cache), (looped, looped_cache) = generate_both(model, prompt, monkeypatch, max_new_tokens=40)
    assert loops["compiled loops"] == 1  # the first call only: the second is GenerationMixin's
    assert compiled.shape == (5, 130) and torch.equal(compiled, looped)
    assert_same_cache(compiled_cache, looped_cache)
    assert compiled_cache.seen_tokens == 90 + 39  # every byte but the last was read, as in GenerationMixin


def test_eos_finishes_each_sequence_and_pads_it_as_generate_does(loops, monkeypatch):
    model = loud_model(eos_token_id=None)
    prompt = repeated_text(batch=5, length=90, seed=3)
    (free, _), _ = generate_both(model, prompt, monkeypatch, max_new_tokens=40)
    eos = int(free[0, 90 + 5])  # row 0 meets it within six bytes and finishes; the other rows go on, or not
    stops = [k for k in range(40) if int(free[0, 90 + k]) in (eos, 258)]
    end = 90 + stops[0] + 1  # row 0's length up to and with its eos
    settings = dict(max_new_tokens=40, eos_token_id=[eos, 258], pad_token_id=7)
    (compiled, compiled_cache), (looped, looped_cache) = generate_both(model, prompt, monkeypatch, **settings)
    assert torch.equal(compiled, looped) and loops["compiled loops"] == 2
    assert (compiled[0, end:] == 7).all() and compiled.shape[1] <= 130  # padded after eos; ends early if all finish
    assert_same_cache(compiled_cache, looped_cache)
    with torch.no_grad():
        one_row = model.generate(prompt[:1], do_sample=False, **settings)  # alone, it stops at its eos
    assert one_row.shape[1] == end and int(one_row[0, -1]) in (eos, 258)


def test_a_wrong_memory_changes_the_bytes(monkeypatch):
    """Negative control: the loud model's memory decides its bytes, so equal bytes above are not a given."""
    model = loud_model(eos_token_id=None)
    prompt = repeated_text(batch=2, length=90, seed=2)
    with torch.no_grad():
        right = model.generate(prompt, max_new_tokens=40, do_sample=False)
        cache = model(prompt[:, :-1]).cache
        cache.memory.spectrum = cache.memory.spectrum * 0.5
        wrong = model.generate(prompt, cache=cache, max_new_tokens=40, do_sample=False)
    assert not torch.equal(right, wrong)


def test_memory_kept_across_calls_and_returned(loops, monkeypatch):
    model = loud_model(eos_token_id=None)
    prompt = repeated_text(batch=1, length=60, seed=4)
    caches, texts = [], []
    for loop in ("1", "0"):
        monkeypatch.setenv("KATHLEEN_FUSED_GENERATE", loop)
        cache = model.new_cache()
        with torch.no_grad():
            first = model.generate(prompt, cache=cache, max_new_tokens=20, do_sample=False)
            more = model.generate(torch.cat([first, prompt[:, :7]], 1), cache=cache, max_new_tokens=20,
                                  do_sample=False, return_dict_in_generate=True)
        assert more.cache is cache
        caches.append(cache)
        texts.append(more.sequences)
    assert loops["compiled loops"] == 2 and torch.equal(*texts)
    assert_same_cache(*caches)



@pytest.mark.parametrize("do_sample", [False, True], ids=["compiled loop", "GenerationMixin's loop"])
def test_new_bytes_alone_after_a_kept_cache_are_refused_by_name(do_sample):
    """Continuing a kept memory takes the whole sequence so far, as any Transformers cache does; the new bytes
    alone (or only what the cache read) would be sliced to nothing, so generate names the convention."""
    model = tiny_model(eos_token_id=None).eval()
    prompt = repeated_text(batch=1, length=30, seed=4)
    cache = model.new_cache()
    with torch.no_grad():
        first = model.generate(prompt, cache=cache, max_new_tokens=10, do_sample=False)
        read = cache.get_seq_length()
        for ids in (prompt[:, :3], first[:, :read]):
            with pytest.raises(ValueError, match=f"the cache has already read {read} bytes per row and input_ids "
                                                 f"holds {ids.shape[1]}: pass the whole sequence so far"):
                model.generate(ids, cache=cache, max_new_tokens=5, do_sample=do_sample)
        assert cache.get_seq_length() == read  # the refused calls read nothing
        more = model.generate(torch.cat([first, prompt[:, :3]], 1), cache=cache, max_new_tokens=5,
                              do_sample=do_sample)  # control: the whole sequence continues
    assert more.shape == (1, first.shape[1] + 3 + 5)

def test_one_new_byte_needs_no_loop(loops, monkeypatch):
    model = loud_model(eos_token_id=None)
    prompt = repeated_text(batch=2, length=50)
    (compiled, _), (looped, _) = generate_both(model, prompt, monkeypatch, max_new_tokens=1)
    assert compiled.shape == (2, 51) and torch.equal(compiled, looped)


@pytest.mark.parametrize("settings", [dict(do_sample=True, top_k=5), dict(repetition_penalty=1.3),
                                      dict(output_scores=True, return_dict_in_generate=True),
                                      dict(stop_strings=["zz"]), dict(streamer=True)],
                         ids=["sampling", "a logits processor", "scores asked for", "stop strings", "a streamer"])
def test_calls_that_need_generates_own_loop_get_it(settings, loops):
    model = tiny_model(eos_token_id=None).eval()
    tokenizer = byte_tokenizer()
    if settings.get("streamer"):
        settings = dict(streamer=TextIteratorStreamer(tokenizer))
    if "stop_strings" in settings:
        settings["tokenizer"] = tokenizer
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(repeated_text(batch=1, length=50), max_new_tokens=8, **settings)
    sequences = out.sequences if hasattr(out, "sequences") else out
    assert loops["compiled loops"] == 0 and sequences.shape[1] <= 58
    if "output_scores" in settings:
        assert len(out.scores) == 8


def test_in_training_mode_or_switched_off_generates_own_loop_runs(loops, monkeypatch):
    model = tiny_model(eos_token_id=None)
    model.train()
    model.generate(repeated_text(batch=1, length=50), max_new_tokens=4, do_sample=False)
    model.eval()
    monkeypatch.setenv("KATHLEEN_FUSED_DECODE", "0")  # the compiled step off switches the loop off with it
    model.generate(repeated_text(batch=1, length=50), max_new_tokens=4, do_sample=False)
    assert loops["compiled loops"] == 0
    monkeypatch.delenv("KATHLEEN_FUSED_DECODE")  # control: the same call in eval mode takes the compiled loop
    model.generate(repeated_text(batch=1, length=50), max_new_tokens=4, do_sample=False)
    assert loops["compiled loops"] == 1


def test_a_left_padded_batch_gives_generates_own_bytes(loops, monkeypatch):
    """Prompts of different lengths, padded on the left with a mask: the prefill skips the padding, then the loop."""
    model = loud_model(eos_token_id=None)
    prompt = repeated_text(batch=2, length=80, seed=5)
    mask = torch.ones_like(prompt)
    mask[1, :30] = 0
    prompt[1, :30] = 0  # the pad id
    results = []
    for loop in ("1", "0"):
        monkeypatch.setenv("KATHLEEN_FUSED_GENERATE", loop)
        with torch.no_grad():
            results.append(model.generate(prompt, attention_mask=mask, max_new_tokens=30, do_sample=False))
    assert loops["compiled loops"] == 1 and torch.equal(*results)


def test_a_notebook_the_compiled_step_does_not_read_gets_generates_own_loop(loops):
    """A value table other than the Fourier one (value_codebook "shared") takes the PyTorch step, so generate keeps
    its loop and works; the control is the Fourier model above, whose calls take the compiled loop."""
    model = loud_model(value_codebook="shared", key_binding="bundle", eos_token_id=None)
    with torch.no_grad():
        out = model.generate(repeated_text(batch=2, length=60), max_new_tokens=12, do_sample=False)
    assert out.shape == (2, 72) and loops["compiled loops"] == 0


def test_a_model_cast_after_it_generated_gets_generates_own_loop(loops):
    """`model.to(dtype)` casts the weights in place, so the weights the compiled step listed at the first call are
    the same objects, now of another dtype: the next greedy call takes GenerationMixin's loop and gives the bytes a
    model cast before it ever generated gives (the kernels read fp32 only)."""
    model = loud_model(eos_token_id=None)
    prompt = repeated_text(batch=2, length=60, seed=3)
    twin = loud_model(eos_token_id=None).double()
    twin.load_state_dict(model.state_dict())
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=4, do_sample=False)  # lists the fp32 weights
        assert loops["compiled loops"] == 1  # control: fp32 takes the compiled loop
        out = model.double().generate(prompt, max_new_tokens=20, do_sample=False)
        assert torch.equal(out, twin.generate(prompt, max_new_tokens=20, do_sample=False))
    assert loops["compiled loops"] == 1 and out.shape == (2, 80)
