"""Going back over bytes (cache.py's recording, `KathleenForCausalLM.forward_recording`): a cache whose past
recording is on keeps its state at the last few positions and `crop` returns to one, so assisted and prompt-lookup
decoding, which verify a draft and drop the bytes they reject, give the bytes of plain greedy decoding."""

import copy

import pytest
import torch
from test_decode_step import VARIANTS, loud_model, repeated_text

from conftest import count_crops
from modeling_kathleen_notebook.cache import KathleenCache

PROMPT = repeated_text(batch=1, length=100, seed=4)
# the shipped recipe with a read trust and a repeat bank: every part of the state a crop must bring back
RECIPE = VARIANTS["repeat bank, one trust of the sum"]


def same_state(a: KathleenCache, b: KathleenCache) -> None:
    assert a.seen_tokens == b.seen_tokens
    for name, tensor in b.state_tensors().items():
        torch.testing.assert_close(a.state_tensors()[name], tensor, rtol=0, atol=1e-5, msg=name)


@pytest.fixture
def crops(monkeypatch):
    """The number of bytes each crop dropped."""
    return count_crops(monkeypatch, KathleenCache)


@pytest.mark.parametrize("keep", [0, 3, 8, torch.tensor([2, 50, 99])],
                         ids=["all logits", "the last 3", "the last 8 (3 of them before the kept states)", "positions"])
def test_a_recording_forward_gives_the_logits_and_state_of_one_call(keep):
    model = loud_model(**RECIPE)
    with torch.no_grad():
        plain = model(PROMPT, logits_to_keep=keep)
        recording = model.new_cache()
        recording.activate_past_recording(recurrent_states_to_keep=5)
        recorded = model(PROMPT, cache=recording, logits_to_keep=keep)
    torch.testing.assert_close(recorded.logits, plain.logits, rtol=0, atol=1e-4)
    same_state(recording, plain.cache)
    assert sorted(recording.recorded) == [95, 96, 97, 98, 99]  # the state before each of the last five bytes


def test_crop_goes_back_to_the_state_of_a_cache_that_never_read_the_dropped_bytes():
    model = loud_model(**RECIPE)
    with torch.no_grad():
        cache = model.new_cache()
        cache.activate_past_recording(recurrent_states_to_keep=4)
        model(PROMPT[:, :60], cache=cache)
        model(PROMPT[:, 60:63], cache=cache)  # three more bytes: the kept positions span both forwards
        assert sorted(cache.recorded) == [59, 60, 61, 62]
        cache.crop(-4)
        shorter = model(PROMPT[:, :59]).cache
        same_state(cache, shorter)
        assert cache.recorded == {}
        # from the state it went back to, the next byte's logits are those of a cache that read only 59 bytes
        after = model(PROMPT[:, 59:60], cache=cache).logits
        torch.testing.assert_close(after, model(PROMPT[:, :60]).logits[:, -1:], rtol=0, atol=1e-4)


def test_crop_refuses_what_it_cannot_do_and_changes_nothing():
    model = loud_model(**RECIPE)
    with torch.no_grad():
        cache = model(PROMPT).cache  # never recording: nothing to go back to
        before = {name: t.clone() for name, t in cache.state_tensors().items()}
        with pytest.raises(ValueError, match=r"cannot go back to position 99.*kept: none.*activate_past_recording"):
            cache.crop(-1)
        cache.activate_past_recording(recurrent_states_to_keep=2)
        model(PROMPT[:, :5], cache=cache)
        with pytest.raises(ValueError, match=r"cannot go back to position 100.*kept: \[103, 104\]"):
            cache.crop(-5)
        with pytest.raises(ValueError, match="minus the number of bytes"):
            cache.crop(3)
        assert cache.seen_tokens == 105
        cache.crop(0)  # nothing dropped
        assert cache.seen_tokens == 105 and cache.recorded == {}
    assert all(torch.equal(before[name], t) for name, t in model(PROMPT).cache.state_tensors().items())


def test_prompt_lookup_decoding_gives_the_greedy_bytes(crops):
    model = loud_model(**RECIPE)
    with torch.no_grad():
        greedy = model.generate(PROMPT, max_new_tokens=60, do_sample=False, eos_token_id=None)
        looked_up = model.generate(PROMPT, max_new_tokens=60, do_sample=False, eos_token_id=None,
                                   prompt_lookup_num_tokens=6)
    assert torch.equal(looked_up, greedy)
    assert any(dropped > 0 for dropped in crops)  # drafts were rejected: the cache went back over bytes


def test_going_back_is_what_keeps_the_bytes_right(monkeypatch, crops):
    """Control for the test above: a crop that only counts positions back, and keeps the state of the rejected
    draft, changes the bytes."""
    model = loud_model(**RECIPE)

    def forgetful(self, tokens_to_remove):
        self.seen_tokens += tokens_to_remove
        self.recorded = {}

    monkeypatch.setattr(KathleenCache, "crop", forgetful)
    with torch.no_grad():
        greedy = model.generate(PROMPT, max_new_tokens=60, do_sample=False, eos_token_id=None)
        looked_up = model.generate(PROMPT, max_new_tokens=60, do_sample=False, eos_token_id=None,
                                   prompt_lookup_num_tokens=6)
    assert not torch.equal(looked_up, greedy)


def test_an_assistant_model_drafts_and_the_model_keeps_its_own_bytes(crops):
    model = loud_model(**RECIPE)
    assistant = loud_model(**RECIPE, seed=1)  # another model: its drafts are often wrong
    with torch.no_grad():
        greedy = model.generate(PROMPT, max_new_tokens=40, do_sample=False, eos_token_id=None)
        assisted = model.generate(PROMPT, max_new_tokens=40, do_sample=False, eos_token_id=None,
                                  assistant_model=assistant)
    assert torch.equal(assisted, greedy)
    assert any(dropped > 0 for dropped in crops)


def test_after_a_crop_the_cache_keeps_every_byte_until_the_next_one():
    """Transformers' draft-and-verify loop ends each round in a crop that may reach back over every byte read since
    the last one, further than the number recording began with once a draft grows."""
    model = loud_model(**RECIPE)
    with torch.no_grad():
        cache = model.new_cache()
        cache.activate_past_recording(recurrent_states_to_keep=2)
        model(PROMPT[:, :60], cache=cache)
        assert sorted(cache.recorded) == [58, 59]  # before the first crop: the last two only
        cache.crop(0)
        model(PROMPT[:, 60:66], cache=cache)  # a round's draft, longer than two bytes
        model(PROMPT[:, 66:67], cache=cache)
        assert sorted(cache.recorded) == list(range(60, 67))
        cache.crop(-6)
        same_state(cache, model(PROMPT[:, :61]).cache)
        assert cache.recorded == {}
        cache.activate_past_recording(recurrent_states_to_keep=2)  # a new recording starts from the given number
        model(PROMPT[:, 61:70], cache=cache)
        assert sorted(cache.recorded) == [68, 69]


@pytest.mark.parametrize("schedule", ["heuristic", "constant"])
def test_an_assistant_whose_drafts_grow_still_gives_the_greedy_bytes(crops, schedule):
    """The assistant's own cache records too (Transformers crops it after each round), and with the "heuristic"
    schedule a draft grows by two bytes after each one accepted whole, past the three recording began with."""
    model = loud_model(**RECIPE)
    assistant = copy.deepcopy(model)  # nearly the model: whole drafts are often accepted, and some bytes not
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in assistant.parameters():
            weight.add_(torch.randn(weight.shape, generator=noise) * 0.02)
    assistant.generation_config.num_assistant_tokens = 3
    assistant.generation_config.num_assistant_tokens_schedule = schedule
    with torch.no_grad():
        greedy = model.generate(PROMPT, max_new_tokens=100, do_sample=False, eos_token_id=None)
        assisted = model.generate(PROMPT, max_new_tokens=100, do_sample=False, eos_token_id=None,
                                  assistant_model=assistant)
    assert torch.equal(assisted, greedy)
    assert max(crops) > (3 if schedule == "heuristic" else 0)  # a grown draft was rejected: a crop past three bytes


def test_a_reset_cache_records_nothing_until_recording_is_asked_for_again():
    """reset() leaves the cache as new: no state, no recording (a reused cache would otherwise copy its state before
    every byte of a long prompt), and a recording asked for anew keeps the last n again."""
    model = loud_model(**RECIPE)
    with torch.no_grad():
        cache = model.new_cache()
        cache.activate_past_recording(recurrent_states_to_keep=3)
        model(PROMPT[:, :40], cache=cache)
        cache.crop(-2)  # into the draft-and-verify loop: from here every byte read is kept
        cache.reset()
        model(PROMPT, cache=cache)
        assert cache.seen_tokens == 100 and cache.recorded == {}
        same_state(cache, model(PROMPT).cache)
        cache.reset()
        cache.activate_past_recording(recurrent_states_to_keep=3)
        model(PROMPT, cache=cache)
        assert sorted(cache.recorded) == [97, 98, 99]
