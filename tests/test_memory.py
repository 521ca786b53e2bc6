"""NotebookSession: exact unlearning, attribution, a memory kept on disk across processes."""

import copy
import dataclasses
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import run_fresh_python, tiny_model
from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
from modeling_kathleen_notebook.experiments.needle import CONTEXT_BYTES, make_needle_example
from modeling_kathleen_notebook.record import scan, trace
from modeling_kathleen_notebook.session import NotebookSession

TEXT = ("The cat sat on the mat. The dog ran in the park! Is the sky blue? "
        "Water boils at one hundred degrees.\nPaper is made of wood. " * 3).encode()


def session_with_gate(forgetting: bool) -> NotebookSession:
    model = tiny_model(forgetting=forgetting)
    with torch.no_grad():  # a gate that writes some bytes and skips others; forgetting that matters
        model.model.memory.gate.out.weight.normal_(0.0, 3.0)
        model.model.memory.gate.out.bias.zero_()
        model.model.memory.forget_logit.fill_(1.0)
    return NotebookSession(model)


def relative(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("forgetting", [False, True])
def test_unlearning_equals_never_writing_the_span(forgetting):
    session = session_with_gate(forgetting)
    session.read(TEXT[:200], chunk_size=64)  # read in pieces: the record must stitch them exactly
    session.read(TEXT[200:])
    notebook = session.notebook
    ids = session.ids.unsqueeze(0)
    with torch.no_grad():
        traced, _ = trace(notebook, ids, torch.ones_like(ids, dtype=torch.bool))
        _, memory = scan(notebook, traced, output_final_state=True)
    assert relative(session.cache.memory.spectrum, memory) <= 1e-5  # the record reproduces the memory
    span = session.find("The dog ran in the park!")[1]
    session.unlearn(span=span)
    kept = torch.ones_like(session.beta)
    kept[span[0]:span[1]] = 0
    with torch.no_grad():
        _, expected = scan(notebook, dataclasses.replace(traced, writes=traced.writes * kept[None, :, None]),
                                    output_final_state=True)
    assert relative(session.cache.memory.spectrum, expected) <= 1e-5
    assert session.summary()["erased_positions"] == span[1] - span[0]


def test_unlearning_after_a_conversation_break_and_by_text():
    session = session_with_gate(True)
    session.read(TEXT[:150])
    session.forget_trunk()
    assert all(s.integrator.abs().max() == 0 for s in session.cache.trunk)
    session.read(TEXT[150:300])
    before = session.cache.memory.spectrum.clone()
    spans = session.unlearn(text="The cat sat on the mat.")
    assert len(spans) >= 2
    whole = session.contributions([(0, len(session.ids))])[0]  # everything not erased = the memory
    assert relative(session.cache.memory.spectrum[0], whole) <= 1e-5
    assert (session.cache.memory.spectrum - before).abs().max() > 0
    with pytest.raises(ValueError, match="never read"):
        session.unlearn(text="no such sentence")


def oracle_session(length, seed):
    torch.manual_seed(seed)
    model = KathleenForCausalLM(KathleenConfig(d_model=16, n_layers=1, forgetting=False,
                                               key_window=CONTEXT_BYTES)).eval()
    example = make_needle_example(length, random.Random(seed), n_needles=5)
    session = NotebookSession(model)
    session.read(example.input_ids, write_mask=example.write_mask(), segments=example.needle_spans)
    return session, example



def test_attribute_takes_the_answer_as_text_and_refuses_an_empty_side():
    session = NotebookSession(tiny_model(std=0.3))
    session.read("Ada lives in Paris. Bob lives in Rome.", source="notes")
    as_text = session.attribute("Ada lives in", " Paris")
    as_ids = session.attribute("Ada lives in", torch.tensor([ord(c) + 3 for c in " Paris"]))  # what ask returns
    assert [(a.byte, a.trunk_logit, a.memory_logit, a.sources) for a in as_text] == \
        [(a.byte, a.trunk_logit, a.memory_logit, a.sources) for a in as_ids]
    assert "".join(a.byte for a in as_text) == " Paris"  # control: the answer's own bytes, one row each
    for prompt, answer in (("", " Paris"), ("Ada lives in", ""), ("Ada", torch.tensor([], dtype=torch.long))):
        with pytest.raises(ValueError, match="attribute needs a prompt and an answer of at least one byte each"):
            session.attribute(prompt, answer)


def test_unlearning_a_fact_twice_is_refused_and_changes_nothing():
    session = NotebookSession(tiny_model(std=0.3))
    session.read("Ada lives in Paris. Bob lives in Rome.", source="notes")
    assert session.unlearn(text="Ada lives in Paris.") == [(0, 19)]
    memory = session.cache.memory.spectrum.clone()
    for again in (dict(text="Ada lives in Paris."), dict(span=(0, 19)), dict(span=(3, 10))):
        with pytest.raises(ValueError, match="nothing left to unlearn: .* was unlearned already"):
            session.unlearn(**again)
    assert torch.equal(session.cache.memory.spectrum, memory)
    with pytest.raises(ValueError, match="not inside the"):  # a bad span keeps its own message
        session.unlearn(span=(5, 2))
    assert session.unlearn(span=(10, 25)) == [(10, 25)]  # control: partly gone, partly live: its live part goes
    assert not torch.equal(session.cache.memory.spectrum, memory)

@pytest.mark.parametrize("length", [512, 2048])
def test_oracle_gate_unlearning_and_attribution(length):
    erased, retained, provenance = [], [], []
    for trial in range(6):
        session, example = oracle_session(length, seed=length + trial)
        victim = trial % 5
        facts = []
        for start, end in example.needle_spans:
            ids = example.input_ids[start:end]
            facts.append((ids[:7], ids[7:]))  # "<MARK>key", value
        attributions = []
        for prompt, value in facts:
            attributions.append(session.attribute(prompt, value, top=1))
        session.unlearn(span=example.needle_spans[victim])
        for f, (prompt, value) in enumerate(facts):
            query = torch.cat([prompt, value]).unsqueeze(0)
            cache = copy.deepcopy(session.cache)
            with torch.no_grad():
                out = session.model(query, cache=cache, write_mask=torch.zeros_like(query, dtype=torch.float))
            hits = (out.memory_logits[0, 6:12].argmax(-1) == value).float().mean().item()
            (erased if f == victim else retained).append(hits)
            for item in attributions[f]:
                if item.recalled:
                    provenance.append(item.sources[0][0].start == example.needle_spans[f][0])
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(erased) <= 0.15, erased
    assert mean(retained) >= 0.75, retained
    assert len(provenance) >= 100 and mean(provenance) >= 0.98, (len(provenance), mean(provenance))


def test_save_load_in_fresh_process_continues_exactly(tmp_path):
    model = tiny_model(std=0.3)
    model.save_pretrained(tmp_path / "model")
    model = KathleenForCausalLM.from_pretrained(tmp_path / "model").eval()
    session = NotebookSession(model, model_path=str(tmp_path / "model"))
    session.read(TEXT[:180])
    session.save(str(tmp_path / "memory.safetensors"))
    session.read(TEXT[180:])
    probe = session.ask("The cat", max_new_tokens=8)
    code = f"""
import torch
from safetensors.torch import save_file
from modeling_kathleen_notebook.session import NotebookSession
session = NotebookSession.from_pretrained({str(tmp_path / "model")!r})
session.load("memory.safetensors")
session.read({TEXT[180:]!r})
save_file({{"memory": torch.view_as_real(session.cache.memory.spectrum),
            "probe": session.ask("The cat", max_new_tokens=8)}}, "after.safetensors")
"""
    run_fresh_python(code, cwd=tmp_path)
    after = load_file(tmp_path / "after.safetensors")
    torch.testing.assert_close(torch.view_as_complex(after["memory"]), session.cache.memory.spectrum, rtol=0, atol=1e-5)
    assert torch.equal(after["probe"], probe)


def test_bad_memory_files_are_refused_and_the_memory_is_kept(tmp_path):
    session = NotebookSession(tiny_model(std=0.3))
    session.read(TEXT[:100])
    good = tmp_path / "good.safetensors"
    session.save(str(good))
    before = copy.deepcopy((session.cache.memory.spectrum, session.ids, session.segments))
    other = NotebookSession(tiny_model(hrr_dim=128))
    other.read(TEXT[:50])
    other.save(str(tmp_path / "other.safetensors"))
    data = good.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 100])
    tensors = load_file(good)
    from safetensors import safe_open

    with safe_open(str(good), framework="pt") as handle:
        metadata = handle.metadata()
    save_file(tensors, tmp_path / "v0.safetensors", metadata={**metadata, "session_version": "0"})
    for name, message in [("other", "fingerprint"), ("cut", "truncated or corrupted"), ("v0", "version")]:
        with pytest.raises(ValueError, match=message):
            session.load(str(tmp_path / f"{name}.safetensors"))
        assert torch.equal(session.cache.memory.spectrum, before[0]) and torch.equal(session.ids, before[1])
        assert session.segments == before[2]
    with pytest.raises(ValueError, match="empty"):
        session.read("")


def test_bad_arguments_are_refused_and_the_memory_is_kept():
    """What is not text, bytes or ids is a TypeError before anything is read (`bytes(5)` would have written five
    zero bytes), an empty text to unlearn a ValueError; the memory and its record stay as they were."""
    session = NotebookSession(tiny_model(std=0.3))
    session.read(TEXT[:100])
    before = copy.deepcopy((session.cache.memory.spectrum, session.ids, session.segments))
    for bad in (5, 2.5, None, ["The cat"]):
        with pytest.raises(TypeError, match="expected text"):
            session.read(bad)
        with pytest.raises(TypeError, match="expected text"):
            session.ask(bad, max_new_tokens=2)
    for empty in ("", b""):
        with pytest.raises(ValueError, match="empty"):
            session.unlearn(text=empty)
    assert torch.equal(session.cache.memory.spectrum, before[0]) and torch.equal(session.ids, before[1])
    assert session.segments == before[2]
    session.read(bytearray(TEXT[100:120]))  # bytes-like is bytes
    assert session.ids.numel() == before[1].numel() + 20


TWO_FACTS = "The vault code of Marlow is QX7RZ. The vault code of Tessa is BK44P. Nothing else is stored."


def two_facts_of_one_shape() -> NotebookSession:
    """A session with a repeat bank that read TWO_FACTS, every byte written once at full strength."""
    model = tiny_model(hrr_dim=65536, key_binding="bind", write_signal="surprise", key_window=16, repeat_key_window=4)
    session = NotebookSession(model)
    session.read(TWO_FACTS, write_mask=torch.ones(len(TWO_FACTS)))
    return session


@pytest.mark.parametrize("clear_shared_keys", [True, False])
def test_unlearning_a_fact_leaves_its_question_no_other_value_through_the_short_keys(clear_shared_keys):
    """Two facts of one sentence shape share the repeat bank's 4-byte key before their values (" is "). Once
    Marlow's is unlearned, his question reads nothing there (clear_shared_keys: every write under a 4-byte window of
    his sentence is cleared from the repeat bank, and only those) instead of Tessa's value (the control: False),
    while Tessa's question is still answered through the 16-byte key of the first memory. R = 65,536 keeps the
    crosstalk of the other writes near 0.05 nats, a tenth of a hit."""
    session = two_facts_of_one_shape()
    model, text, fact = session.model, TWO_FACTS, TWO_FACTS[:34]
    session.unlearn(text=fact, clear_shared_keys=clear_shared_keys)

    def memory_logit(question: str, byte: str) -> float:
        with torch.no_grad():
            out = model(torch.tensor([[b + 3 for b in question.encode()]]), cache=copy.deepcopy(session.cache))
        return float(out.memory_logits[0, -1, ord(byte) + 3])

    assert memory_logit(" The vault code of Tessa is ", "B") > 0.3  # Tessa's fact is kept, through its long key
    marlow = memory_logit(" The vault code of Marlow is ", "B")
    windows = {text[u - 4:u] for u in range(4, len(fact))}  # the keys the fact wrote under (it starts the text)
    shared = [u for u in range(len(fact), len(text)) if text[u - 4:u] in windows]  # " is " -> B, "ault" -> " ", ...
    assert session.repeat_cleared.nonzero().flatten().tolist() == (shared if clear_shared_keys else [])
    if clear_shared_keys:
        assert abs(marlow) < 0.15 and len(shared) > 5
    else:
        assert marlow > 0.3  # the hazard: Marlow's question reads Tessa's value through " is "


def test_cleared_short_keys_are_kept_on_disk(tmp_path):
    """A saved session remembers which writes were cleared from its repeat bank, so unlearning after a reload
    subtracts them no second time; a version-1 file (before clearing existed) loads with none cleared."""
    session = two_facts_of_one_shape()
    session.unlearn(text="The vault code of Marlow is QX7RZ.", clear_shared_keys=True)
    session.save(str(tmp_path / "memory.safetensors"))
    loaded, lost = (NotebookSession(session.model) for _ in range(2))
    loaded.load(str(tmp_path / "memory.safetensors"))
    lost.load(str(tmp_path / "memory.safetensors"))
    lost.repeat_cleared.zero_()  # the control: a record that forgot what was cleared
    assert torch.equal(loaded.repeat_cleared, session.repeat_cleared) and loaded.repeat_cleared.any()
    for s in (session, loaded, lost):
        s.unlearn(text="The vault code of Tessa is BK44P.")  # shares "ault", " is ", ... with what was cleared
    assert torch.equal(loaded.cache.memory.repeat_spectrum, session.cache.memory.repeat_spectrum)
    assert (lost.cache.memory.repeat_spectrum - session.cache.memory.repeat_spectrum).abs().max() > 0.1

    tensors = load_file(tmp_path / "memory.safetensors")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "memory.safetensors"), framework="pt") as handle:
        metadata = handle.metadata()
    del tensors["record.repeat_cleared"]
    save_file(tensors, tmp_path / "v1.safetensors", metadata={**metadata, "session_version": "1"})
    old = NotebookSession(session.model)
    old.load(str(tmp_path / "v1.safetensors"))
    assert not old.repeat_cleared.any() and len(old.repeat_cleared) == len(old.ids)
