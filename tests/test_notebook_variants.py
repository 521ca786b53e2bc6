"""The notebook's variants of issue 18: bound keys and writes by the trunk's surprise. Each fast path equals the
one-step path and the sequential reference; decoding equals the full forward; unlearning stays exact."""

import copy
import dataclasses

import pytest
import torch

from conftest import run_form, tiny_config, tiny_model
from modeling_kathleen_notebook.codebooks import bound_key_spectra
from modeling_kathleen_notebook.configuration_kathleen import PAD_ID
from modeling_kathleen_notebook.notebook import Notebook, trunk_surprise
from modeling_kathleen_notebook.read_trust import ReadTrust
from modeling_kathleen_notebook.record import scan, trace
from modeling_kathleen_notebook.scan_read import scan_and_read, scan_and_read_reference
from modeling_kathleen_notebook.session import NotebookSession

VARIANTS = [dict(key_binding="bind"), dict(write_signal="surprise"), dict(write_signal="gate+surprise"),
            dict(key_binding="bind", write_signal="surprise"),
            dict(key_binding="bind", write_signal="surprise", key_window=16),  # the window of today's defaults
            dict(fact_bank=True), dict(key_binding="bind", write_signal="surprise", fact_bank=True),
            dict(key_binding="bind", write_signal="surprise", key_window=16, repeat_key_window=4),
            dict(key_binding="bind", write_signal="surprise", key_window=16, repeat_key_window=4, read_trust=True,
                 repeat_read_trust=True),
            dict(key_binding="bind", write_signal="surprise", read_trust=True)]  # last: the trust's control uses it
RECORDED = [v for v in VARIANTS if not v.get("fact_bank")]  # sessions: banks written with the same β


def variant_notebook(seed=0, **overrides) -> Notebook:
    torch.manual_seed(seed)
    notebook = Notebook(tiny_config(**overrides)).eval()
    with torch.no_grad():  # β that differs between bytes; forgetting that matters
        if notebook.gate is not None:
            notebook.gate.out.bias.fill_(0.0)
            notebook.gate.out.weight.normal_(0.0, 3.0)
        notebook.forget_logit.fill_(1.0)
    return notebook


def random_logits(B, T, seed=1):
    return torch.randn(B, T, 259, generator=torch.Generator().manual_seed(seed)) * 3


def stream_with_logits(notebook, ids, valid, logits, step):
    """Like conftest.stream_through, with the trunk's logits of each piece."""
    state, outs = None, []
    for start in range(0, ids.shape[1], step):
        piece = slice(start, start + step)
        out, state = notebook(ids[:, piece], valid[:, piece], state, trunk_logits=logits[:, piece])
        outs.append(out)
    return torch.cat(outs, dim=1), state


@pytest.mark.parametrize("overrides", VARIANTS)
@pytest.mark.parametrize("forgetting", [False, True])
@pytest.mark.parametrize("T", [1, 7, 100])
def test_streaming_equals_parallel(overrides, forgetting, T):
    notebook = variant_notebook(forgetting=forgetting, **overrides)
    ids = torch.randint(3, 259, (2, T))
    valid = torch.ones(2, T, dtype=torch.bool)
    logits = random_logits(2, T)
    with torch.no_grad():
        full, full_state = notebook(ids, valid, trunk_logits=logits)
        one_by_one, state = stream_with_logits(notebook, ids, valid, logits, 1)
        pieces, _ = stream_with_logits(notebook, ids, valid, logits, 45)
    assert T == 1 or full.abs().max() > 1e-3
    torch.testing.assert_close(one_by_one, full, rtol=0, atol=1e-4)
    torch.testing.assert_close(pieces, full, rtol=0, atol=1e-4)
    torch.testing.assert_close(state.spectrum, full_state.spectrum, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.fact_spectrum, full_state.fact_spectrum, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.repeat_spectrum, full_state.repeat_spectrum, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.last_logits, full_state.last_logits)


@pytest.mark.parametrize("overrides", VARIANTS)
@pytest.mark.parametrize("forgetting", [False, True])
def test_parallel_equals_sequential_reference_with_padding(overrides, forgetting):
    notebook = variant_notebook(forgetting=forgetting, scan_chunk=16, **overrides)
    ids = torch.randint(0, 259, (3, 70))
    valid = torch.rand(3, 70) > 0.15
    ids = torch.where(valid, ids, PAD_ID)
    logits = random_logits(3, 70)
    with torch.no_grad():
        first, state = notebook(ids[:, :40], valid[:, :40], trunk_logits=logits[:, :40])
        first_ref, state_ref = run_form(scan_and_read_reference, notebook, ids[:, :40], valid[:, :40],
                                        trunk_logits=logits[:, :40])
        second, final = notebook(ids[:, 40:], valid[:, 40:], state, trunk_logits=logits[:, 40:])
        second_ref, final_ref = run_form(scan_and_read_reference, notebook, ids[:, 40:], valid[:, 40:], state_ref,
                                         trunk_logits=logits[:, 40:])
    first_ref, second_ref = first_ref.float(), second_ref.float()
    scale = first_ref.abs().max()
    assert scale > 1e-3
    torch.testing.assert_close(first / scale, first_ref / scale, rtol=0, atol=1e-5)
    torch.testing.assert_close(second / scale, second_ref / scale, rtol=0, atol=1e-5)
    torch.testing.assert_close(final.spectrum, final_ref.spectrum.to(final.spectrum.dtype), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final.fact_spectrum, final_ref.fact_spectrum.to(torch.complex64), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final.repeat_spectrum, final_ref.repeat_spectrum.to(torch.complex64), rtol=1e-4,
                               atol=1e-4)
    torch.testing.assert_close(final.last_logits, final_ref.last_logits)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_gradients_of_the_fast_path_equal_the_reference(overrides):
    notebook = variant_notebook(**overrides)
    notebook.train()
    ids = torch.randint(3, 259, (2, 50))
    valid = torch.ones(2, 50, dtype=torch.bool)
    logits = random_logits(2, 50)
    grads = []
    for form in (scan_and_read, scan_and_read_reference):
        notebook.zero_grad()
        out, _ = run_form(form, notebook, ids, valid, trunk_logits=logits)
        notebook.trusted(out.float(), logits).square().mean().backward()  # the read trust acts on the read, at the head
        grads.append({name: p.grad.clone() for name, p in notebook.named_parameters()})
    for name, grad in grads[1].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grads[0][name], grad, rtol=1e-3, atol=1e-6)
    if notebook.config.uses_surprise:  # the surprise is detached: no gradient flows into the trunk's logits
        leaf = logits.clone().requires_grad_()
        notebook(ids, valid, trunk_logits=leaf)[0].sum().backward()
        assert leaf.grad is None


def test_trunk_surprise_is_minus_log_prob_and_skips_padding():
    ids = torch.tensor([[5, 9, 7, 4]])
    logits = random_logits(1, 4)
    before = torch.randn(1, 259)
    surprise, last = trunk_surprise(ids, logits, before, None)
    log_probs = torch.log_softmax(torch.cat([before[:, None], logits], 1), -1)
    expected = -torch.stack([log_probs[0, t, ids[0, t]] for t in range(4)])
    torch.testing.assert_close(surprise[0], expected)
    torch.testing.assert_close(last, logits[:, -1])
    # with a pad in the middle, the byte after it is scored by the prediction before the pad
    valid = torch.tensor([[True, False, True, True]])
    surprise, last = trunk_surprise(torch.where(valid, ids, PAD_ID), logits, before, valid)
    assert torch.isclose(surprise[0, 2], -torch.log_softmax(logits[0, 0], -1)[7])
    assert not torch.isclose(surprise[0, 2], expected[2])  # negative control: not the pad's own prediction
    # nothing real in the call: the last prediction stays as it was
    _, last = trunk_surprise(torch.zeros(1, 2, dtype=torch.long), logits[:, :2], before,
                             torch.zeros(1, 2, dtype=torch.bool))
    torch.testing.assert_close(last, before)


def test_bound_keys_are_unit_and_share_nothing_with_partly_equal_windows():
    """Bundled keys of windows that agree in 4 of 7 bytes have cosine ≈ 4/7; bound keys ≈ 0 (SPEC §10)."""
    cosines = {}
    for binding in ("bundle", "bind"):
        notebook = Notebook(tiny_config(key_binding=binding, hrr_dim=2048))
        a = torch.tensor([[40, 41, 42, 43, 44, 45, 46]])
        b = torch.tensor([[90, 91, 92, 43, 44, 45, 46]])  # the same last four bytes
        keys = [notebook.tables().bind(torch.cat([torch.zeros(1, notebook.tail_length, dtype=torch.long), x], 1), 7)
                .normalised_keys()[0, -1] for x in (a, b)]
        vectors = [torch.fft.irfft(k, n=2048) for k in keys]
        assert all(torch.isclose(v.norm(), torch.tensor(1.0), atol=1e-4) for v in vectors)
        cosines[binding] = float(vectors[0] @ vectors[1])
    assert abs(cosines["bundle"] - 4 / 7) < 0.1
    assert abs(cosines["bind"]) < 0.1


def test_bound_keys_of_anagram_windows_differ():
    """A product of one spectrum per byte would be commutative: a window and its rotation ("ber is " / "er is b")
    would share a key and a read would recall the wrong byte. Each slot has its own frequencies instead."""
    notebook = Notebook(tiny_config(key_binding="bind", hrr_dim=2048))
    windows = torch.tensor([[ord(c) + 3 for c in w] for w in ("ber is ", "er is b")])
    keys = bound_key_spectra(windows, notebook.key_frequencies)
    vectors = torch.fft.irfft(keys, n=2048)
    assert abs(float(vectors[0] @ vectors[1])) < 0.1
    # negative control: with one set of frequencies for every slot, the two windows share a key
    same = bound_key_spectra(windows, notebook.key_frequencies[:1].expand(7, -1))
    torch.testing.assert_close(same[0], same[1], rtol=0, atol=1e-4)


def test_bound_codebooks_are_small_whatever_r_is():
    small, large = (Notebook(tiny_config(key_binding="bind", hrr_dim=R)) for R in (256, 65536))
    assert {name: tuple(b.shape) for name, b in large.named_buffers()} == {
        "key_frequencies": (7, 32769), "value_frequencies": (32769,)}
    assert sum(b.numel() for b in large.buffers()) * 8 < 3 * 2**20
    with pytest.raises(ValueError, match="fourier"):
        tiny_config(key_binding="bind", value_codebook="gaussian")
    assert small.key_frequencies.shape == (7, 129)


def test_bound_key_tables_grow_with_the_values_not_the_window():
    """The derived tables of bound keys hold [V, F] values and [W, F] frequencies, no [W·V, F] table of turns (it
    would be 1.9 GB at R = 524,288), and their keys still equal `bound_key_spectra`'s."""
    V, F = 259, 32769
    tables = Notebook(tiny_config(key_binding="bind", hrr_dim=65536)).tables()
    held = sum(t.numel() * t.element_size() for t in vars(tables).values() if isinstance(t, torch.Tensor))
    assert held < (V * 8 + 7 * 8 + 7 * 8) * F + 2**20  # write_values, key_rows, key_frequencies, roots
    ids = torch.randint(0, V, (2, 40))
    keys = tables.bind(ids, 33).keys
    torch.testing.assert_close(keys, bound_key_spectra(ids.unfold(1, 7, 1)[:, -34:], tables.key_frequencies))
    # negative control: the turn table this replaced is 7x the values' table on its own
    assert 7 * V * F * 4 > held


@pytest.mark.parametrize("overrides", VARIANTS)
def test_model_decoding_equals_full_forward_and_padding_is_skipped(overrides):
    model = tiny_model(std=0.3, **overrides)
    ids = torch.randint(3, 259, (2, 30))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :10])
        steps = [out.logits]
        for t in range(10, 30):
            out = model(ids[:, t:t + 1], cache=out.cache)
            steps.append(out.logits)
        left = model(torch.cat([torch.zeros(1, 5, dtype=torch.long), ids[:1]], 1),
                     attention_mask=torch.cat([torch.zeros(1, 5), torch.ones(1, 30)], 1).long())
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-4)
    torch.testing.assert_close(left.logits[:, 5:], full[:1], rtol=0, atol=1e-4)
    generated = model.generate(ids[:, :5], max_new_tokens=8, do_sample=False, eos_token_id=None)
    with torch.no_grad():
        assert torch.equal(generated[:, 5:6], model(ids[:, :5]).logits[:, -1:].argmax(-1))


def test_surprise_needs_the_byte_head():
    model = tiny_model(write_signal="surprise")
    with pytest.raises(ValueError, match="surprise"):
        model.model(torch.randint(3, 259, (1, 5)))
    with pytest.raises(ValueError, match="surprise"):
        model.model.memory(torch.randint(3, 259, (1, 5)), None)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())


@pytest.mark.parametrize("clear_shared_keys", [True, False])
@pytest.mark.parametrize("overrides", RECORDED)
def test_unlearning_and_attribution_stay_exact(overrides, clear_shared_keys):
    """Each memory after unlearning equals the record replayed without the erased writes: the span's in every
    memory, and in a repeat bank (clear_shared_keys) also every write under a key the span wrote under."""
    model = tiny_model(std=0.3, forgetting=True, **overrides)
    session = NotebookSession(model)
    text = b"Ada keeps the key QX7. Bo keeps the key ZR2. The rest is ordinary prose about nothing. " * 2
    session.read(text[:90], chunk_size=32)
    session.read(text[90:])
    notebook, ids = session.notebook, session.ids.unsqueeze(0)
    span = session.find("Bo keeps the key ZR2.")[0]
    kept = torch.ones_like(session.beta)
    kept[span[0]:span[1]] = 0
    before = session.cache.memory
    session.unlearn(span=span, clear_shared_keys=clear_shared_keys)
    cleared = session.repeat_cleared
    assert bool(cleared.any()) == (clear_shared_keys and len(notebook.banks()) > 1)  # "keeps the key " is shared
    for i, bank in enumerate(notebook.banks()):  # each memory (a repeat bank's too) is replayed from the record
        kept_here = kept * ~cleared if i == 1 else kept
        with torch.no_grad():
            traced, _ = trace(notebook, ids, None, write_mask=session.beta.unsqueeze(0), tables=bank.tables)
            _, memory = scan(notebook, traced, output_final_state=True)
            _, expected = scan(notebook, dataclasses.replace(traced, writes=traced.writes * kept_here[None, :, None]),
                               output_final_state=True)
        assert relative_error(getattr(before, bank.field), memory) <= 1e-5  # the record (ids, β) is the memory
        assert relative_error(getattr(session.cache.memory, bank.field), expected) <= 1e-5
        change = (getattr(before, bank.field) - expected).abs().max()  # control: the span was in this memory
        assert change > 10 * (getattr(session.cache.memory, bank.field) - expected).abs().max() and change > 0
    summary = session.summary()
    norms = [summary[name] for name in ("memory_norm", "repeat_memory_norm") if name in summary]
    assert len(norms) == len(notebook.banks()) and all(n > 0 for n in norms)
    assert all(n <= summary.get("memory_norm_bound", float("inf")) for n in norms)
    prompt, answer = "Ada keeps the key ", torch.tensor([ord(c) + 3 for c in "QX7"])
    items = session.attribute(prompt, answer, top=1)
    assert len(items) == 3 and all(item.sources for item in items)
    for one, whole in zip(session.attribute(prompt, answer, top=3, segment_batch=1),
                          session.attribute(prompt, answer, top=3)):  # segments one at a time: the same ranking
        assert [s for s, _ in one.sources] == [s for s, _ in whole.sources]
        assert torch.allclose(torch.tensor([d for _, d in one.sources]), torch.tensor([d for _, d in whole.sources]),
                              atol=1e-4)
    for t, item in enumerate(items):  # the drop named for a source is what erasing that source takes away
        segment, drop = item.sources[0]
        if session.erased[segment.start:segment.end].all():  # gone already: it adds nothing, and cannot go again
            assert abs(drop) < 1e-5
            continue
        erased = copy.deepcopy(session)
        erased.unlearn(span=(segment.start, segment.end), clear_shared_keys=False)  # its own writes, as attribution
        after = erased.attribute(prompt, answer, top=1)[t].memory_logit
        assert abs((item.memory_logit - after) - drop) < 1e-3 * max(1.0, abs(drop))


def test_the_fact_bank_is_written_at_the_shifted_logit_and_never_forgets():
    notebook = variant_notebook(forgetting=True, fact_bank=True)
    with torch.no_grad():
        notebook.fact_shift.fill_(1.5)
    ids = torch.randint(3, 259, (2, 90))
    with torch.no_grad():
        _, state = notebook(ids, None)
        beta = notebook.write_strengths(notebook.with_tail(ids, None), 90, None)
    B = ids.shape[0]
    gate_logit = torch.logit(beta[:B], eps=0)
    torch.testing.assert_close(beta[B:], torch.sigmoid(gate_logit - 1.5), rtol=0, atol=1e-5)
    # the fact bank is the first bank's write with β_f and no forgetting: a notebook without forgetting, told β_f
    torch.manual_seed(0)
    plain = Notebook(tiny_config(forgetting=False)).eval()
    with torch.no_grad():
        _, unforgotten = plain(ids, None, write_mask=beta[B:])
        _, forgotten = notebook(ids, None, write_mask=beta[B:])  # the first bank, told the same β_f, forgets
    torch.testing.assert_close(state.fact_spectrum, unforgotten.spectrum, rtol=1e-4, atol=1e-4)
    assert (forgotten.spectrum - unforgotten.spectrum).abs().max() > 1e-2  # control: forgetting shows


@pytest.mark.parametrize("bank, overrides", [
    ("fact_spectrum", dict(fact_bank=True)),
    ("repeat_spectrum", dict(key_binding="bind", write_signal="surprise", key_window=16, repeat_key_window=4))])
def test_a_second_bank_is_saved_and_a_fact_bank_refused_where_it_is_not_covered(tmp_path, bank, overrides):
    from modeling_kathleen_notebook.cache import KathleenCache
    from modeling_kathleen_notebook.export import export_step

    model = tiny_model(std=0.3, **overrides)
    with torch.no_grad():
        cache = model(torch.randint(3, 259, (1, 40))).cache
    assert getattr(cache.memory, bank).abs().max() > 0
    cache.save(tmp_path / "memory.safetensors")
    loaded = KathleenCache.load(tmp_path / "memory.safetensors", model.config)
    torch.testing.assert_close(getattr(loaded.memory, bank), getattr(cache.memory, bank))
    one_bank = {**overrides, "fact_bank": False, "repeat_key_window": 0}
    with pytest.raises(ValueError, match="fingerprint"):  # a one-bank model cannot read a two-bank memory
        KathleenCache.load(tmp_path / "memory.safetensors", tiny_config(**one_bank))
    if bank == "fact_spectrum":  # written with another β than the record keeps, and not in the exported step
        with pytest.raises(ValueError, match="bank"):
            NotebookSession(model)
        with pytest.raises(ValueError, match="bank"):
            export_step(model, tmp_path / "step.onnx")
    else:  # control: a repeat bank is covered by both
        NotebookSession(model)
        assert export_step(model, tmp_path / "step.onnx").exists()


REPEAT_BANK = dict(key_binding="bind", write_signal="surprise", hrr_dim=4096, key_window=16, repeat_key_window=4)


def repeat_bank_notebook(**overrides) -> Notebook:
    return variant_notebook(**REPEAT_BANK, **overrides)


def test_the_repeat_bank_is_a_memory_keyed_by_the_newest_slots():
    """The repeat bank's memory is what a one-bank notebook with key_window W' and the first W' rows of the key
    frequencies writes, given the same β and forgetting."""
    notebook = repeat_bank_notebook(forgetting=True)
    ids = torch.randint(3, 259, (2, 90))
    beta = torch.rand(2, 90)
    torch.manual_seed(1)
    short = Notebook(tiny_config(**{**REPEAT_BANK, "key_window": 4, "repeat_key_window": 0})).eval()
    with torch.no_grad():
        short.key_frequencies.copy_(notebook.key_frequencies[:4])
        short.value_frequencies.copy_(notebook.value_frequencies)
        short.forget_logit.copy_(notebook.forget_logit)
        _, state = notebook(ids, None, write_mask=beta)
        _, expected = short(ids, None, write_mask=beta)
    torch.testing.assert_close(state.repeat_spectrum, expected.spectrum, rtol=1e-4, atol=1e-3)
    assert (state.spectrum - expected.spectrum).abs().max() > 1.0  # control: the long keys write elsewhere
    assert notebook.repeat_tables().write_values is notebook.tables().write_values  # one value table, not two


def test_the_repeat_bank_recalls_a_repeat_whose_long_context_changed():
    """"...abcdZ" written after one 16-byte context is recalled after "abcd" in another: by the repeat bank's 4-byte
    key, not by the first memory's 16-byte one."""
    notebook = repeat_bank_notebook(forgetting=False)
    first, second = b"the old context: abcdZ and more text", b"a new beginning, abcd"
    ids = torch.tensor([[b + 3 for b in first + second]])
    z = ord("Z") + 3
    with torch.no_grad():
        notebook.read_scale.fill_(1.0)
        notebook.repeat_read_scale.fill_(0.0)
        long_only, _ = notebook(ids, None, write_mask=torch.ones_like(ids, dtype=torch.float))
        notebook.repeat_read_scale.fill_(1.0)
        both, _ = notebook(ids, None, write_mask=torch.ones_like(ids, dtype=torch.float))
    assert both[0, -1].argmax() == z
    assert both[0, -1, z] - long_only[0, -1, z] > 0.7  # a hit reads about 1
    assert long_only[0, -1].argmax() != z  # control: the 16-byte key of the new context finds crosstalk only


def test_a_trust_per_memory_trusts_each_read_apart():
    """With repeat_read_trust the notebook hands both reads side by side, the first memory's first, and each passes
    its own trust before they are added; one trust of their sum (the control) gives other logits."""
    notebook = repeat_bank_notebook(forgetting=True, read_trust=True, repeat_read_trust=True)
    summed = repeat_bank_notebook(forgetting=True, read_trust=True)
    summed.load_state_dict(notebook.state_dict(), strict=False)  # the same memory, tables and first trust
    for trust, bias in ((notebook.trust, 6.0), (notebook.repeat_trust, -1.0), (summed.trust, 6.0)):
        with torch.no_grad():  # loud and different: a sure read gains nats, crosstalk capped at 0.05 nats
            trust.weights.copy_(torch.tensor([bias, -3.7, 0.7, -0.15, 0.14, -0.28]))
            trust.log_noise_cap.fill_(-3.0)
    ids = torch.randint(3, 259, (2, 90))
    ids[:, 60:] = ids[:, :30]  # repeats: both memories hit
    beta, logits = torch.rand(2, 90), random_logits(2, 90)
    with torch.no_grad():
        reads, _ = notebook(ids, None, write_mask=beta)
        total, _ = summed(ids, None, write_mask=beta)
        first, repeat = reads.split(259, -1)
        torch.testing.assert_close(first + repeat, total)
        expected = (notebook.trust.forward_reference(first, logits)
                    + notebook.repeat_trust.forward_reference(repeat, logits))
        torch.testing.assert_close(notebook.trusted(reads, logits), expected, rtol=1e-4, atol=1e-4)
        assert (notebook.trusted(reads, logits) - summed.trusted(total, logits)).abs().max() > 0.1  # control
        notebook.repeat_read_scale.fill_(0.0)  # the second half is the repeat bank's
        without_repeat, _ = notebook(ids, None, write_mask=beta)
    assert without_repeat[..., 259:].abs().max() == 0 and repeat.abs().max() > 1e-2
    torch.testing.assert_close(without_repeat[..., :259], first)


@pytest.mark.parametrize("bad, match", [
    (dict(repeat_key_window=16), "repeat_key_window"), (dict(repeat_key_window=-1), "repeat_key_window"),
    (dict(repeat_key_window=True), "repeat_key_window"), (dict(repeat_key_window=4, key_binding="bundle"), "bind"),
    (dict(repeat_key_window=4, fact_bank=True), "fact_bank"), (dict(repeat_read_trust=True), "repeat_read_trust"),
    (dict(repeat_key_window=4, read_trust=False, repeat_read_trust=True), "repeat_read_trust")])
def test_a_repeat_bank_that_cannot_work_is_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**{"key_binding": "bind", "key_window": 16, **bad})
    assert tiny_config(key_binding="bind", key_window=16, repeat_key_window=4).repeat_key_window == 4  # control


@pytest.mark.parametrize("first_read", [0, 150, 299])
def test_a_long_input_at_a_large_memory_runs_in_pieces_and_equals_streaming(first_read, monkeypatch):
    import modeling_kathleen_notebook.scan_read as scan_read_module

    notebook = variant_notebook(key_binding="bind", write_signal="surprise", forgetting=True)
    ids = torch.randint(3, 259, (2, 300))
    logits = random_logits(2, 300)
    with torch.no_grad():
        whole, state, beta = notebook(ids, None, trunk_logits=logits, first_read=first_read,
                                      output_write_strengths=True)
        # pieces of 50 positions at R = 256, across the scan's chunks of 32
        monkeypatch.setattr(scan_read_module, "PIECE_ELEMENTS", 50 * 129)
        tables, formed = notebook.tables(), []
        bind = tables.bind
        monkeypatch.setattr(type(tables), "bind", lambda self, ids, n: formed.append(n) or bind(ids, n))
        pieces, piece_state, piece_beta = notebook(ids, None, trunk_logits=logits, first_read=first_read,
                                                   output_write_strengths=True)
    assert formed == [50] * 6  # control: the keys really were formed piece by piece
    assert pieces.shape == whole.shape == (2, 300 - first_read, 259)
    torch.testing.assert_close(pieces, whole, rtol=0, atol=1e-4)
    torch.testing.assert_close(piece_state.spectrum, state.spectrum, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(piece_beta, beta)


def test_read_trust_lifts_a_sure_read_only():
    """A byte standing far out of the rest gains k · (z - τ), more where the trunk is unsure; flat crosstalk, a
    zero (padding) row and a notebook without a trust are left as they are."""
    trust = ReadTrust()
    with torch.no_grad():
        trust.weights.copy_(torch.tensor([-10.0, 0.0, 0.0, 0.0, -2.0, 0.0]))  # k = softplus(-10 - 2 max log p)
        trust.threshold.fill_(4.0)
    noise = torch.randn(3, 259, generator=torch.Generator().manual_seed(0)) * 0.1
    hit = noise[0].clone()
    hit[42] += 5.0
    reads = torch.stack([hit, noise[1], torch.zeros(259)]).unsqueeze(0)  # [1, 3, V]
    unsure, sure = torch.zeros(1, 3, 259), torch.zeros(1, 3, 259)
    sure[..., 7] = 20.0
    lifted = trust(reads, unsure)
    z = (hit[42] - hit.mean()) / hit.std()
    k = torch.nn.functional.softplus(-10 + 2 * torch.log(torch.tensor(259.0)))
    assert z > 10 and torch.isclose(lifted[0, 0, 42] - reads[0, 0, 42], k * (z - 4.0))
    assert torch.equal(lifted[0, 0, :42], reads[0, 0, :42]) and torch.equal(lifted[0, 1:], reads[0, 1:])
    assert trust(reads, sure)[0, 0, 42] - reads[0, 0, 42] < 1e-3 * (lifted[0, 0, 42] - reads[0, 0, 42])
    notebook = Notebook(tiny_config())
    assert notebook.trust is None and torch.equal(notebook.trusted(reads, unsure), reads)


def test_the_trust_variant_lifts_reads_in_the_model():
    """Control for the read-trust VARIANTS above: in a tiny model it does fire (else their tests would not test it)."""
    model = tiny_model(std=0.3, **VARIANTS[-1])
    ids = torch.tensor([list(b"Ada keeps the key QX7. Ada keeps the key QX7.")]) + 3
    with torch.no_grad():
        trusted = model(ids).memory_logits
        model.model.memory.trust = None
        linear = model(ids).memory_logits
    assert (trusted - linear).abs().max() > 0.1
