"""scripts/resize_memory.py: a trained model moved to another R keeps every trained weight, draws its codebooks
anew from the seed, and comes back to the same logits when moved back."""

import importlib.util
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from modeling_kathleen_notebook import KathleenConfig

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("resize_memory", ROOT / "scripts" / "resize_memory.py")
resize_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(resize_memory)


@pytest.mark.parametrize("binding", ["bundle", "bind"])
def test_resizing_keeps_weights_and_round_trips(binding):
    model = tiny_model(std=0.3, key_binding=binding, write_signal="surprise", hrr_dim=256)
    bigger = resize_memory.resized(model, 1024)
    assert bigger.config.hrr_dim == 1024
    params = dict(model.named_parameters())
    for name, weight in bigger.named_parameters():
        assert torch.equal(weight, params[name]), name
    assert all(b.shape[-1] in (1024, 513) for name, b in bigger.named_buffers() if "memory" in name)
    ids = torch.randint(3, 259, (1, 40))
    with torch.no_grad():
        before, wide, back = (m(ids).logits for m in (model, bigger, resize_memory.resized(bigger, 256)))
    torch.testing.assert_close(back, before, rtol=0, atol=1e-5)
    assert (wide - before).abs().max() > 1e-3  # negative control: another R is another memory


def test_forgetting_switch_and_the_calibration_grid():
    """resized(..., forgetting=True) keeps the weights and forgets (another memory: other logits after a long
    input); the candidate grid starts with the trained setting and holds every combination once."""
    import argparse

    model = tiny_model(std=0.3, key_binding="bind", write_signal="surprise", hrr_dim=256, forgetting=False)
    forgetting = resize_memory.resized(model, 256, forgetting=True)
    assert forgetting.config.forgetting and not model.config.forgetting
    ids = torch.randint(3, 259, (1, 200))
    with torch.no_grad():
        assert torch.equal(resize_memory.resized(model, 256)(ids).logits, model(ids).logits)
        assert (forgetting(ids).logits - model(ids).logits).abs().max() > 1e-4
    args = argparse.Namespace(scales="4,8", shifts="0,1", surprise_scales="1", forget_logits="-5")
    memory = forgetting.model.memory
    grid = resize_memory.candidates(memory, args, uses_surprise=True, forgetting=True)
    trained = {k: float(getattr(memory, k).detach()) for k in resize_memory.KNOBS if hasattr(memory, k)}
    assert grid[0] == trained and len(grid) == 3 * 2 * 2 * 2
    assert len({tuple(sorted(s.items())) for s in grid}) == len(grid)


def test_rekeying_keeps_weights_and_separates_facts_of_one_sentence_shape():
    """resized(..., key_window=16) keeps every trained weight and draws keys over 16 bytes. Two facts of one
    shape whose names lie more than 7 bytes before the value share their 7-byte key (the control: the value
    position's keys are equal), while 16-byte keys reach the names and are nearly orthogonal."""
    from modeling_kathleen_notebook.codebooks import bound_key_spectra
    from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids

    model = tiny_model(std=0.3, key_binding="bind", write_signal="surprise", hrr_dim=1024)
    rekeyed = resize_memory.resized(model, 1024, key_window=16)
    assert (model.config.key_window, rekeyed.config.key_window) == (7, 16)
    assert rekeyed.model.memory.tail_length == 16
    params = dict(model.named_parameters())
    for name, weight in rekeyed.named_parameters():
        assert torch.equal(weight, params[name]), name
    prompts = ["The boat owned by Kofi Mensah is called ", "The boat owned by Aiko Tanaka is called "]

    def key_overlap(notebook) -> float:
        W = notebook.config.key_window
        keys = [bound_key_spectra(bytes_to_ids(p.encode())[-W:], notebook.key_frequencies) for p in prompts]
        return float((keys[0] * keys[1].conj()).real.mean())

    assert key_overlap(model.model.memory) == pytest.approx(1.0)  # control: the same 7 bytes, the same key
    assert abs(key_overlap(rekeyed.model.memory)) < 0.1


def test_a_repeat_bank_is_added_at_the_first_memory_s_read_scale_and_taken_away_again():
    model = tiny_model(std=0.3, key_binding="bind", write_signal="surprise", hrr_dim=256, key_window=16)
    with_bank = resize_memory.resized(model, 256, repeat_key_window=4)
    memory = with_bank.model.memory
    assert with_bank.config.repeat_key_window == 4
    assert torch.equal(memory.repeat_read_scale, memory.read_scale)
    params = dict(model.named_parameters())
    for name, weight in with_bank.named_parameters():
        assert name == "model.memory.repeat_read_scale" or torch.equal(weight, params[name]), name
    ids = torch.randint(3, 259, (1, 120))
    with torch.no_grad():
        back = resize_memory.resized(with_bank, 256, repeat_key_window=0)
        assert torch.equal(back(ids).logits, model(ids).logits)
        assert (with_bank(ids).logits - model(ids).logits).abs().max() > 1e-4  # control: the bank reads something
    with pytest.raises(ValueError, match="repeat_key_window"):
        resize_memory.resized(model, 256, repeat_key_window=16)


def test_a_repeat_banks_own_trust_moves_with_it_and_goes_with_the_trust_or_the_bank():
    model = tiny_model(std=0.3, key_binding="bind", write_signal="surprise", hrr_dim=256, key_window=16,
                       repeat_key_window=4, read_trust=True, repeat_read_trust=True)
    bigger = resize_memory.resized(model, 1024)
    assert bigger.config.repeat_read_trust
    torch.testing.assert_close(bigger.model.memory.repeat_trust.weights, model.model.memory.repeat_trust.weights)
    for dropped in (resize_memory.resized(model, 256, drop_trust=True),
                    resize_memory.resized(model, 256, repeat_key_window=0)):
        assert not dropped.config.repeat_read_trust and dropped.model.memory.repeat_trust is None
    assert resize_memory.resized(model, 256, repeat_key_window=0).model.memory.trust is not None  # only the bank's


def test_a_second_resize_keeps_the_earlier_steps(tmp_path):
    """resize.json of a model resized after its trust was fitted lists the first resize and the fit, oldest first;
    a checkpoint with neither record has no history."""
    import json

    assert resize_memory.earlier_commands(tmp_path) == []
    (tmp_path / "resize.json").write_text(json.dumps({"command": "resize 1", "earlier_commands": ["resize 0"]}))
    (tmp_path / "read_trust.json").write_text(json.dumps({"command": "fit"}))
    assert resize_memory.earlier_commands(tmp_path) == ["resize 0", "resize 1", "fit"]


def test_a_notebook_attached_to_a_bare_trunk_stays_attached_when_resized_again(tmp_path):
    """The card's "attached after training" comes from resize.json: a bare trunk is attached; a notebook model is
    attached only if its own resize.json says it was (the control: a jointly trained model, or one without a record,
    is not)."""
    import json

    trunk, joint = tiny_model(memory="none"), tiny_model()
    assert resize_memory.attached_to_bare_trunk(tmp_path, trunk)
    assert not resize_memory.attached_to_bare_trunk(tmp_path, joint)
    (tmp_path / "resize.json").write_text(json.dumps({"command": "resize 0", "attached_to_bare_trunk": False}))
    assert not resize_memory.attached_to_bare_trunk(tmp_path, joint)
    (tmp_path / "resize.json").write_text(json.dumps({"command": "resize 0", "attached_to_bare_trunk": True}))
    assert resize_memory.attached_to_bare_trunk(tmp_path, joint)


def test_a_bare_trunk_gets_a_notebook_that_leaves_its_logits_alone():
    """A trunk trained without memory, given a notebook: the trunk and head are copied (trunk logits exactly the
    bare model's), the notebook starts at the config's initial scalars, and its reads move the logits once the text
    repeats (the control: a notebook that reads nothing would leave them equal). An attention arm is refused."""
    trunk = tiny_model(std=0.3, memory="none")  # its config carries [KR]'s notebook settings, unused
    attached = resize_memory.resized(trunk, 1024, key_window=4)
    assert attached.config.memory == "notebook" and attached.config.hrr_dim == 1024
    defaults = KathleenConfig()
    assert trunk.config.write_signal == "gate" != defaults.write_signal  # control: the trunk's config differs
    fields = ("write_signal", "key_binding", "read_trust", "read_noise_cap_init", "forgetting")
    assert {n: getattr(attached.config, n) for n in fields} == {n: getattr(defaults, n) for n in fields}
    assert attached.model.memory.read_scale.item() == pytest.approx(attached.config.effective_read_scale_init)
    ids = torch.randint(3, 259, (1, 30)).repeat(1, 3)
    with torch.no_grad():
        bare, out = trunk(ids).logits, attached(ids)
    torch.testing.assert_close(out.trunk_logits, bare, rtol=0, atol=0)
    assert out.memory_logits[0, -20:].abs().max() > 0.1
    with pytest.raises(ValueError, match="attention"):
        resize_memory.resized(tiny_model(memory="attention"), 1024)


def test_a_resize_keeps_the_record_of_the_read_trust_s_fit(tmp_path):
    """read_trust.json of the checkpoint, else the record its own resize.json kept (a second resize); none
    without either."""
    import json

    assert resize_memory.read_trust_record(tmp_path) is None
    (tmp_path / "resize.json").write_text(json.dumps({"command": "resize 1", "read_trust": {"noise_cap": 0.5}}))
    assert resize_memory.read_trust_record(tmp_path) == {"noise_cap": 0.5}
    (tmp_path / "read_trust.json").write_text(json.dumps({"command": "fit", "noise_cap": 0.1}))
    assert resize_memory.read_trust_record(tmp_path) == {"command": "fit", "noise_cap": 0.1}


def test_the_read_trust_s_cap_can_be_set_and_a_model_without_a_trust_says_so():
    import math

    model = tiny_model(key_binding="bind", write_signal="surprise", read_trust=True)
    assert model.model.memory.trust.log_noise_cap.item() == 10.0  # control: tiny models start unbound
    resize_memory.set_noise_cap(model.model.memory, 0.028)
    assert model.model.memory.trust.log_noise_cap.item() == pytest.approx(math.log(0.028))
    with pytest.raises(ValueError, match="positive"):
        resize_memory.set_noise_cap(model.model.memory, 0.0)
    with pytest.raises(ValueError, match="no read trust"):
        resize_memory.set_noise_cap(tiny_model().model.memory, 0.03)
