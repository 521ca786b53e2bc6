"""KathleenForCausalLM with generate: every decoding mode equals the uncached full forward."""

import copy
import functools

import pytest
import torch
from transformers import GenerationConfig, pipeline

from conftest import tiny_model
from modeling_kathleen_notebook import KathleenCache, KathleenConfig, KathleenForCausalLM
from modeling_kathleen_notebook.configuration_kathleen import KR_NOTEBOOK

PROMPT = torch.tensor([[10, 20, 30, 40, 50, 60, 70]])
GREEDY = dict(do_sample=False, eos_token_id=None, max_new_tokens=12)


def full_logits(model, sequences, attention_mask=None):
    with torch.no_grad():
        return model(sequences, attention_mask=attention_mask, use_cache=False).logits


MEMORIES = {"notebook": dict(memory="notebook"), "attention": dict(memory="attention"),
            "attention, previous keys": dict(memory="attention", attention_keys="previous"),
            "none": dict(memory="none")}


@pytest.mark.parametrize("memory", MEMORIES)
def test_incremental_decoding_equals_full_forward(memory, device):
    model = tiny_model(std=0.3, **MEMORIES[memory]).to(device)
    ids = torch.randint(3, 259, (2, 150)).to(device)
    with torch.no_grad():
        full = model(ids).logits
        cache, steps = None, []
        for t in range(ids.shape[1]):
            out = model(ids[:, t:t + 1], cache=cache)
            cache, _ = out.cache, steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-4)
    assert cache.get_seq_length() == 150


def test_outputs_split_into_trunk_and_memory():
    model = tiny_model(std=0.3)
    with torch.no_grad():
        out = model(PROMPT)
        last = model(PROMPT, logits_to_keep=1)
    torch.testing.assert_close(out.logits, out.trunk_logits + out.memory_logits)
    torch.testing.assert_close(last.logits, out.logits[:, -1:])
    assert out.memory_logits.abs().max() > 0
    with torch.no_grad():  # return_dict=False: the same fields as a tuple, for the model and its base
        as_tuple = model(PROMPT, return_dict=False)
        hidden, memory_logits, cache, trunk_logits, write_strengths, _ = model.model(PROMPT, return_dict=False)
    assert trunk_logits is None and write_strengths is None  # no lm_head passed, no β asked for
    assert torch.equal(as_tuple[0], out.logits) and torch.equal(memory_logits, out.memory_logits)
    assert torch.equal(model.lm_head(hidden) + memory_logits, out.logits) and cache.get_seq_length() == 7


@pytest.mark.parametrize("memory", MEMORIES)
def test_logits_to_keep_reads_only_the_kept_positions_and_keeps_the_state(memory):
    """logits_to_keep = n: the last n logits of the full forward (the notebook skips the reads before them),
    memory_logits of n positions, and the same cache: the next byte's logits are equal too. Left padding
    included; a tensor of positions still selects those."""
    model = tiny_model(std=0.3, **MEMORIES[memory])
    ids = torch.randint(3, 259, (2, 100))
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    nxt = torch.randint(3, 259, (2, 1))
    with torch.no_grad():
        full = model(ids, attention_mask=mask)
        after_full = model(nxt, attention_mask=torch.cat([mask, mask[:, :1]], 1), cache=full.cache).logits
        for n in (1, 37, 100):
            kept = model(ids, attention_mask=mask, logits_to_keep=n)
            torch.testing.assert_close(kept.logits, full.logits[:, -n:], rtol=0, atol=1e-5)
            if memory != "none":
                assert kept.memory_logits.shape[1] == n
            after = model(nxt, attention_mask=torch.cat([mask, mask[:, :1]], 1), cache=kept.cache).logits
            torch.testing.assert_close(after, after_full, rtol=0, atol=1e-5)
        chosen = torch.tensor([3, 50, 99])
        torch.testing.assert_close(model(ids, attention_mask=mask, logits_to_keep=chosen).logits,
                                   full.logits[:, chosen], rtol=0, atol=1e-5)


def test_labels_give_shifted_cross_entropy():
    model = tiny_model()
    ids = torch.randint(3, 259, (2, 30))
    labels = ids.clone()
    labels[0, :5] = -100
    out = model(ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert model.model.memory.gate.conv.weight.grad.abs().sum() > 0


def test_greedy_equals_full_forward(device):
    model, prompt = tiny_model(seed=1, std=0.3).to(device), PROMPT.to(device)
    out = model.generate(prompt, output_logits=True, return_dict_in_generate=True, **GREEDY)
    expected = full_logits(model, out.sequences)[:, prompt.shape[1] - 1:-1]
    torch.testing.assert_close(torch.stack(out.logits, 1), expected, rtol=0, atol=1e-4)
    assert torch.equal(out.sequences, model.generate(prompt, use_cache=False, **GREEDY))


def test_seeded_sampling_equals_uncached():
    model = tiny_model(seed=1, std=0.3)
    runs = []
    for use_cache in (True, False):
        torch.manual_seed(7)
        runs.append(model.generate(PROMPT, do_sample=True, top_k=0, max_new_tokens=20, eos_token_id=None,
                                   use_cache=use_cache))
    assert torch.equal(*runs)
    assert len(set(runs[0][0, 7:].tolist())) > 3  # sampling did explore


def beam(model):
    return model.generate(PROMPT, num_beams=4, num_return_sequences=2, max_new_tokens=12, do_sample=False,
                          eos_token_id=None, return_dict_in_generate=True, output_scores=True)


def test_beam_search_equals_uncached_and_needs_reordering(monkeypatch):
    model = tiny_model(seed=1, std=0.3)
    cached = beam(model)
    uncached = model.generate(PROMPT, num_beams=4, num_return_sequences=2, max_new_tokens=12, do_sample=False,
                              eos_token_id=None, return_dict_in_generate=True, output_scores=True, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, rtol=0, atol=1e-4)
    monkeypatch.setattr(KathleenCache, "reorder_cache", lambda self, beam_idx: None)
    broken = beam(model)  # the negative control: without reordering the result must change
    assert not torch.equal(broken.sequences, cached.sequences) or not torch.allclose(
        broken.sequences_scores, cached.sequences_scores, atol=1e-4)


@pytest.mark.parametrize("memory", ["notebook", "attention, previous keys"])
def test_left_padded_batch_equals_rows_alone(memory, device):
    model = tiny_model(seed=1, std=0.3, **MEMORIES[memory]).to(device)
    prompts = [[10, 20, 30, 40, 50, 60, 70], [99, 98], [5, 6, 7, 8]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    batch = model.generate(ids, attention_mask=mask, output_logits=True, return_dict_in_generate=True, **GREEDY)
    for row, prompt in enumerate(prompts):
        alone = model.generate(torch.tensor([prompt], device=device), output_logits=True, return_dict_in_generate=True,
                               **GREEDY)
        assert batch.sequences[row, width:].tolist() == alone.sequences[0, len(prompt):].tolist()
        torch.testing.assert_close(torch.stack(batch.logits, 1)[row], torch.stack(alone.logits, 1)[0],
                                   rtol=0, atol=1e-4)


def test_chunked_prefill_equals_plain(device):
    model = tiny_model(seed=1, std=0.3).to(device)
    prompt = torch.randint(3, 259, (1, 50)).to(device)
    plain = model.generate(prompt, **GREEDY)
    assert torch.equal(model.generate(prompt, prefill_chunk_size=8, **GREEDY), plain)


def test_continue_from_returned_cache():
    model = tiny_model(seed=1, std=0.3)
    first = model.generate(PROMPT, return_dict_in_generate=True, **{**GREEDY, "max_new_tokens": 6})
    more = model.generate(first.sequences, cache=first.cache, **{**GREEDY, "max_new_tokens": 6})
    assert torch.equal(more, model.generate(PROMPT, **GREEDY))


def test_deepcopy_snapshot_branches_twice():
    model = tiny_model(seed=1, std=0.3)
    with torch.no_grad():
        snapshot = model(PROMPT).cache
        for branch in ([[100, 101, 102]], [[7, 8, 9, 10]]):
            cache = copy.deepcopy(snapshot)
            out = model(torch.tensor(branch), cache=cache)
            expected = full_logits(model, torch.cat([PROMPT, torch.tensor(branch)], 1))[:, PROMPT.shape[1]:]
            torch.testing.assert_close(out.logits, expected, rtol=0, atol=1e-4)
        assert snapshot.get_seq_length() == PROMPT.shape[1]  # the snapshot itself never moved


def test_pipeline_generates_text(tmp_path):
    model = tiny_model(seed=1, std=0.3)
    model.save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path), trust_remote_code=True, device="cpu")
    text = generator("Hello", max_new_tokens=10, do_sample=False)[0]["generated_text"]
    assert text.startswith("Hello") and len(text.encode()) > len("Hello")


def test_a_callers_max_length_is_the_length_they_get():
    """The shipped default is 200 new bytes (max_new_tokens); Transformers lets a default max_new_tokens win over a
    max_length the caller sets, so without our override each of these would be 12 + 200 bytes long."""
    model = tiny_model(seed=1, std=0.3)
    prompt = torch.randint(3, 259, (1, 12), generator=torch.Generator().manual_seed(0))
    fixed = dict(do_sample=False, eos_token_id=None)
    assert model.generate(prompt, max_length=20, **fixed).shape[1] == 20
    assert model.generate(prompt, generation_config=GenerationConfig(max_length=20, **fixed)).shape[1] == 20
    assert model.generate(prompt, max_length=20, max_new_tokens=3, **fixed).shape[1] == 15  # both: new tokens win
    assert model.generate(prompt, max_new_tokens=3, **fixed).shape[1] == 15
    assert model.generate(prompt, **fixed).shape[1] == 12 + model.generation_config.max_new_tokens  # the default


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loads_and_generates_with_fp32_state(tmp_path, dtype):
    model = tiny_model(seed=1, std=0.3)
    model.save_pretrained(tmp_path)
    half = KathleenForCausalLM.from_pretrained(tmp_path, dtype=dtype).eval()
    assert half.lm_head.weight.dtype == dtype
    out = half.generate(PROMPT, return_dict_in_generate=True, **GREEDY)
    assert out.sequences.shape == (1, PROMPT.shape[1] + 12)
    assert all(s.integrator.dtype == torch.float32 for s in out.cache.trunk)
    assert out.cache.memory.spectrum.dtype == torch.complex64
    with torch.no_grad():
        assert torch.isfinite(half(PROMPT).logits).all()


def test_bad_inputs_raise_clear_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[5, 259]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[-1, 5]]))
    with pytest.raises(ValueError, match="empty"):
        model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        model(torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"shape \[batch, length\]"):
        model(torch.tensor([5, 6]))
    other = tiny_model(d_model=30)
    with pytest.raises(ValueError, match="fingerprint"):
        model(PROMPT, cache=other(PROMPT).cache)
    with pytest.raises(ValueError, match="holds 1 sequences"):
        model(torch.cat([PROMPT, PROMPT]), cache=model(PROMPT).cache)


@pytest.mark.parametrize("memory", ["notebook", "attention"])
def test_generate_names_what_is_wrong_before_it_starts(memory):
    """generate on 1-D ids stopped in Transformers' mask building with "IndexError: tuple index out of range", and
    output_attentions=True with "no attribute 'attentions'" after the prefill; the forward alone returned no
    weights and said nothing. Now each says what is wrong. Controls: batched ids and output_attentions=False run."""
    model = tiny_model(memory=memory)
    with pytest.raises(ValueError, match=r"shape \[batch, length\], got \(7,\)"):
        model.generate(PROMPT[0], **GREEDY)
    with pytest.raises(ValueError, match="no attention weights"):
        model.generate(PROMPT, output_attentions=True, return_dict_in_generate=True, **GREEDY)
    for forward in (model, model.model):
        with pytest.raises(ValueError, match="no attention weights"):
            forward(PROMPT, output_attentions=True)
    assert model.generate(PROMPT, output_attentions=False, **GREEDY).shape == (1, PROMPT.shape[1] + 12)
    assert model(PROMPT, output_attentions=False).logits.shape[1] == PROMPT.shape[1]


def test_attentions_cache_choices_are_ignored_with_a_warning_as_for_transformers_recurrent_models():
    from transformers.testing_utils import CaptureLogger

    from modeling_kathleen_notebook import causal_lm

    model = tiny_model()
    plain = model.generate(PROMPT, **GREEDY)
    for implementation in ("static", "dynamic"):
        causal_lm.logger.warning_once.cache_clear()
        with CaptureLogger(causal_lm.logger) as captured:
            out = model.generate(PROMPT, cache_implementation=implementation, **GREEDY)
        assert torch.equal(out, plain)
        assert f"cache_implementation='{implementation}' does not apply to it and is ignored" in captured.out
    assert model.generation_config.cache_implementation is None  # the model's own config is left as it was
    with CaptureLogger(causal_lm.logger) as captured:  # control: a call without one says nothing
        model.generate(PROMPT, **GREEDY)
    assert captured.out == ""


def test_config_rejects_bad_values():
    for bad in (dict(memory="lstm"), dict(hrr_dim=2047), dict(value_codebook="x"), dict(scan_chunk=1000),
                dict(decay_bands=[[0.9, 0.5], [0.9, 0.99], [0.95, 0.99]]), dict(d_model=0),
                dict(fourier_period=100), dict(learn_forget_rate="false"), dict(forgetting=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            KathleenConfig(**bad)
    for good in (dict(learn_forget_rate=False), dict(forgetting=False)):  # control: the same settings, true booleans
        assert KathleenConfig(**good)


def test_config_saved_before_fourier_period_loads_with_the_old_period(tmp_path):
    """A config.json without fourier_period was written when the period was the vocabulary size: it loads so,
    and the model saved with it gives the same logits; a new config gets the fast default (288)."""
    import json

    assert KathleenConfig().fourier_period == 288
    model = tiny_model(std=0.3, fourier_period=259)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["fourier_period"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = KathleenForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.fourier_period == 259
    with torch.no_grad():
        assert torch.equal(loaded(PROMPT).logits, model(PROMPT).logits)


def test_config_saved_before_the_defaults_changed_loads_as_it_was_trained(tmp_path):
    """A config.json without key_binding, write_signal or forgetting predates them: it means [KR]'s notebook
    (KR_NOTEBOOK), whatever today's defaults; the control shows the defaults do differ."""
    import json

    assert {name: getattr(KathleenConfig(), name) for name in KR_NOTEBOOK} != KR_NOTEBOOK
    model = tiny_model(std=0.3)  # [KR]'s notebook (conftest)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    for name in KR_NOTEBOOK:
        del saved[name]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = KathleenForCausalLM.from_pretrained(tmp_path)
    assert {name: getattr(loaded.config, name) for name in KR_NOTEBOOK} == KR_NOTEBOOK
    with torch.no_grad():
        assert torch.equal(loaded(PROMPT).logits, model(PROMPT).logits)


def test_key_frequencies_saved_as_int64_load_to_the_same_keys(tmp_path):
    """Bound keys' integers are stored as int16 residues mod 2^16; a checkpoint saved when they were int64 in
    [0, 2^16) loads to the same logits. Control: one residue changed changes them."""
    from safetensors.torch import load_file, save_file

    model = tiny_model(std=0.3, key_binding="bind", write_signal="surprise", hrr_dim=512)
    assert model.model.memory.key_frequencies.dtype == torch.int16
    ids = torch.randint(3, 259, (1, 80), generator=torch.Generator().manual_seed(0))
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    old = weights["model.memory.key_frequencies"].long() % 2**16
    assert old.max() >= 2**15  # the int16 table does hold negative residues: the cast is exercised

    def logits_with(key_frequencies):
        save_file({**weights, "model.memory.key_frequencies": key_frequencies}, tmp_path / "model.safetensors",
                  metadata={"format": "pt"})
        with torch.no_grad():
            return KathleenForCausalLM.from_pretrained(tmp_path)(ids).logits

    with torch.no_grad():
        expected = model(ids).logits
    assert torch.equal(logits_with(old), expected)
    changed = old.clone()
    changed[:, 1:-1] += 1
    assert (logits_with(changed) - expected).abs().max() > 1e-4


def test_import_registers_auto_classes_without_remote_code(tmp_path):
    from transformers import AutoModel, AutoModelForCausalLM

    model = tiny_model(std=0.3)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)  # no trust_remote_code: the registered class
    assert type(loaded) is KathleenForCausalLM
    assert type(AutoModel.from_pretrained(tmp_path)).__name__ == "KathleenModel"
    with torch.no_grad():
        assert torch.equal(loaded(PROMPT).logits, model(PROMPT).logits)


@pytest.mark.parametrize("targets", [["value_proj", "decay_proj", "mix_proj"], ["gate.conv", "gate.embed"]])
def test_a_lora_adapter_takes_effect(targets):
    """PEFT's LoRA in place of the trunk's input projections (otherwise multiplied as one fused matrix) or of
    the write gate's embedding and convolution (otherwise read as a tap table): it changes the logits, merging
    it into the weights gives the same logits, and cached decoding still equals the full forward."""
    import peft  # a test dependency (pyproject: test extra)

    model = tiny_model()
    ids = torch.randint(3, 259, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(ids).logits
    torch.manual_seed(1)
    config = peft.LoraConfig(target_modules=targets, r=4, init_lora_weights=False)
    adapted = peft.get_peft_model(model, config).eval()
    with torch.no_grad():
        lora = adapted(ids).logits
        cache, steps = adapted(ids[:, :20]).cache, []
        for t in range(20, 30):
            out = adapted(ids[:, t:t + 1], cache=cache)
            cache = out.cache
            steps.append(out.logits)
        merged = adapted.merge_and_unload()(ids).logits
    assert (lora - plain).abs().max() > 1e-2
    torch.testing.assert_close(torch.cat(steps, dim=1), lora[:, 20:], rtol=0, atol=1e-4)
    torch.testing.assert_close(merged, lora, rtol=0, atol=1e-4)


def test_return_dict_none_follows_the_config_so_peft_gets_a_loss():
    """PEFT calls forward(..., return_dict=None, labels=...) and reads .loss: None must follow config.return_dict
    (True by default), for the model and its base; config.return_dict = False gives tuples."""
    import peft

    ids = torch.randint(3, 259, (2, 30), generator=torch.Generator().manual_seed(0))
    adapted = peft.get_peft_model(tiny_model(), peft.LoraConfig(target_modules=["value_proj"], r=4))
    out = adapted(input_ids=ids, labels=ids, return_dict=None)
    assert out.loss.ndim == 0 and out.loss.requires_grad
    for model in (tiny_model(), tiny_model().model):
        assert not isinstance(model(ids, return_dict=None), tuple)
        model.config.return_dict = False
        assert isinstance(model(ids), tuple) and not isinstance(model(ids, return_dict=True), tuple)


def test_gradient_checkpointing_recomputes_the_blocks_and_keeps_the_gradients():
    """gradient_checkpointing_enable(): each trunk block runs again in the backward pass (counted), and the
    gradients are those of the plain backward. Control: without it, each block runs once."""
    ids = torch.randint(3, 259, (2, 64), generator=torch.Generator().manual_seed(0))

    def gradients_and_block_runs(checkpointing: bool):
        model = tiny_model(std=0.3, dropout=0.0).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        block, runs = model.model.trunk.blocks[0], []
        projections = block.input_projections
        block.input_projections = lambda u: runs.append(1) or projections(u)
        model(ids, labels=ids).loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, len(runs)

    plain, plain_runs = gradients_and_block_runs(False)
    checkpointed, checkpointed_runs = gradients_and_block_runs(True)
    assert (plain_runs, checkpointed_runs) == (1, 2)
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("variant", [{}, dict(key_binding="bind", write_signal="surprise"), dict(memory="attention")])
def test_forward_on_the_meta_device_gives_the_real_shapes(variant):
    """Size and cost estimates: built and run on the meta device (no memory, no values), forward and one cached
    step give the shapes a real forward gives."""
    config = KathleenConfig(**variant)
    with torch.device("meta"):
        meta = KathleenForCausalLM(config)
    real = KathleenForCausalLM(config).eval()
    ids = torch.randint(3, 259, (2, 40))
    with torch.no_grad():
        shapes = []
        for model, inputs in ((meta, ids.to("meta")), (real, ids)):
            out = model(inputs, labels=inputs)
            step = model(inputs[:, :1], cache=out.cache)
            state = []
            out.cache._map(lambda t, state=state: state.append(t.shape) or t)
            shapes.append([out.logits.shape, out.loss.shape, step.logits.shape, state])
    assert out.logits.device.type == "cpu" and meta.lm_head.weight.is_meta
    assert shapes[0] == shapes[1]


@torch.no_grad()
def test_output_hidden_states():
    """The embedding and each block's output, n_layers + 1 of them, the last the final-normed state; asked per
    call or by config.output_hidden_states; absent otherwise."""
    model = tiny_model(std=0.3)
    out = model(PROMPT, output_hidden_states=True)
    base = model.model(PROMPT, output_hidden_states=True)
    assert len(out.hidden_states) == model.config.n_layers + 1
    assert torch.equal(out.hidden_states[0], model.model.trunk.embed(PROMPT))
    assert torch.equal(out.hidden_states[-1], base.last_hidden_state)
    assert torch.equal(model.lm_head(out.hidden_states[-1]), out.trunk_logits)
    assert all(a.shape == (1, 7, model.config.d_model) for a in out.hidden_states)
    assert model(PROMPT).hidden_states is None
    model.config.output_hidden_states = True
    assert len(model(PROMPT).hidden_states) == model.config.n_layers + 1


def test_peft_knows_the_default_lora_targets():
    """get_peft_model without target_modules adapts the trunk's input projections. Control: without the
    registration PEFT asks for target_modules."""
    import peft
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as targets

    from modeling_kathleen_notebook.modeling_kathleen import LORA_TARGET_MODULES

    adapted = peft.get_peft_model(tiny_model(), peft.LoraConfig(r=4))
    lora = {name.rsplit(".", 2)[-2] for name, _ in adapted.named_modules() if name.endswith("lora_A")}
    assert lora == set(LORA_TARGET_MODULES)
    model = tiny_model()  # built (and registered) before the registration is taken away
    removed = targets.pop(KathleenConfig.model_type)
    try:
        with pytest.raises(ValueError, match="target_modules"):
            peft.get_peft_model(model, peft.LoraConfig(r=4))
    finally:
        targets[KathleenConfig.model_type] = removed


PACKAGE_DEFAULTS = {name: getattr(KathleenConfig(), name) for name in KR_NOTEBOOK}  # tiny_model pins [KR]'s
VARIANTS_THAT_TRAIN = [dict(), dict(forgetting=False), dict(write_signal="gate+surprise"), dict(read_trust=True),
                       dict(memory="none"), dict(learn_forget_rate=False), PACKAGE_DEFAULTS,
                       {**PACKAGE_DEFAULTS, "forgetting": True}]


def parameters_without_gradient(model) -> list[str]:
    ids = torch.randint(3, 259, (2, 40), generator=torch.Generator().manual_seed(0))
    model.train()(ids, labels=ids).loss.backward()
    return [name for name, param in model.named_parameters() if param.requires_grad and param.grad is None]


@pytest.mark.parametrize("variant", VARIANTS_THAT_TRAIN, ids=str)
def test_every_trainable_parameter_gets_a_gradient(variant):
    """DistributedDataParallel stops at a trainable parameter that no loss reaches; so does a silent no-op knob."""
    assert parameters_without_gradient(tiny_model(**variant)) == []


def test_a_reloaded_model_has_no_trainable_parameter_without_gradient(tmp_path):
    """from_pretrained makes every parameter it loads trainable, so a held forget logit must not be one."""
    for variant in (dict(forgetting=False), dict(learn_forget_rate=False)):
        tiny_model(**variant).save_pretrained(tmp_path / str(variant))
        assert parameters_without_gradient(KathleenForCausalLM.from_pretrained(tmp_path / str(variant))) == []


def test_a_trainable_parameter_without_gradient_is_caught():
    model = tiny_model()
    model.model.memory.unused = torch.nn.Parameter(torch.zeros(()))  # as forget_logit was without forgetting once
    assert parameters_without_gradient(model) == ["model.memory.unused"]


def test_the_output_behaves_as_transformers_model_output():
    """KathleenCausalLMOutput skips ModelOutput's per-assignment field lookups: keys, attributes, indexing, tuples,
    copies and pickling stay those of a plain ModelOutput with the same fields (the control)."""
    import dataclasses
    import pickle

    from transformers.utils import ModelOutput

    from modeling_kathleen_notebook.causal_lm import KathleenCausalLMOutput

    ours_fields = dataclasses.fields(KathleenCausalLMOutput)
    same_fields = [(f.name, f.type, dataclasses.field(default=None)) for f in ours_fields]
    Plain = dataclasses.make_dataclass("Plain", same_fields, bases=(ModelOutput,))
    logits, cache = torch.randn(1, 2, 3), tiny_model().new_cache()
    for given in (dict(logits=logits), dict(loss=torch.tensor(1.0), logits=logits, cache=cache),
                  dict(logits=logits, memory_logits=logits + 1, write_strengths=torch.ones(1, 2))):
        ours, plain = KathleenCausalLMOutput(**given), Plain(**given)
        assert list(ours.keys()) == list(plain.keys()) == [name for name in given]  # field order, Nones left out
        assert all(getattr(ours, f.name) is getattr(plain, f.name) for f in dataclasses.fields(ours))
        assert all(a is b for a, b in zip(ours.to_tuple(), plain.to_tuple())) and ours[0] is plain[0]
        assert ours["logits"] is plain["logits"]
        ours.hidden_states = (logits,)  # a field set later becomes a key, as in ModelOutput
        plain.hidden_states = (logits,)
        assert list(ours.keys()) == list(plain.keys())
        ours.past_key_values = plain.past_key_values = cache  # the old cache name, renamed
        assert ours.cache is cache and list(ours.keys()) == list(plain.keys())
        plain_twin = copy.deepcopy(plain)  # through ModelOutput.__reduce__, as pickling (a local class can't pickle)
        for twin in (pickle.loads(pickle.dumps(ours)), copy.deepcopy(ours)):
            assert list(twin.keys()) == list(plain_twin.keys()) and type(twin) is KathleenCausalLMOutput
        rebuilt = {key: value for key, value in ours.items()}  # as accelerate's fp32 conversion rebuilds an output
        assert list(KathleenCausalLMOutput(rebuilt).keys()) == list(Plain(rebuilt).keys()) == list(rebuilt)
        assert KathleenCausalLMOutput(rebuilt).logits is rebuilt["logits"]
    with pytest.raises(Exception, match="__delitem__"):
        del KathleenCausalLMOutput(logits=logits)["logits"]


def test_generation_inputs_are_those_of_generation_mixin(monkeypatch):
    """The model's own prepare_inputs_for_generation (a byte model's cut of GenerationMixin's, without its per-step
    signature inspection) gives the same generations as GenerationMixin's: greedy with a padded batch, seeded
    sampling, beam search."""
    from transformers import GenerationMixin

    model = tiny_model(seed=1, std=0.3)
    prompts = torch.tensor([[0, 0, 10, 20, 30, 40], [11, 21, 31, 41, 51, 61]])
    mask = (prompts != 0).long()

    def generations():
        torch.manual_seed(7)
        return (model.generate(prompts, attention_mask=mask, **GREEDY),
                model.generate(PROMPT, do_sample=True, top_k=0, max_new_tokens=20, eos_token_id=None),
                beam(model).sequences)

    calls = []
    own = KathleenForCausalLM.prepare_inputs_for_generation

    @functools.wraps(own)  # generate checks its keywords against this signature
    def counted(self, *args, **kwargs):
        calls.append(1)
        return own(self, *args, **kwargs)

    monkeypatch.setattr(KathleenForCausalLM, "prepare_inputs_for_generation", counted)
    ours = generations()
    assert calls  # the model's own ran
    monkeypatch.setattr(KathleenForCausalLM, "prepare_inputs_for_generation",
                        GenerationMixin.prepare_inputs_for_generation)
    for mine, theirs in zip(ours, generations()):
        assert torch.equal(mine, theirs)
