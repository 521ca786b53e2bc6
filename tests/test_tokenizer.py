"""The byte tokenizer: exact ids, nothing appended, special-token text stays bytes, U+FFFD on bad UTF-8, pads left."""

import torch
from transformers import AutoTokenizer

from conftest import tiny_model
from modeling_kathleen_notebook.tokenization_kathleen import byte_tokenizer, bytes_to_ids, ids_to_bytes


def test_ids_are_bytes_plus_three_and_nothing_is_appended():
    tokenizer = byte_tokenizer()
    text = "héllo </s> <pad> <unk>\x00\n"
    ids = tokenizer(text)["input_ids"]
    assert ids == [b + 3 for b in text.encode()]
    assert ids == bytes_to_ids(text.encode()).tolist()
    assert tokenizer.decode(ids) == text
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)


def test_invalid_utf8_decodes_to_replacement_character():
    tokenizer = byte_tokenizer()
    assert tokenizer.decode([0xFF + 3, ord("a") + 3]) == "\ufffda"
    assert ids_to_bytes([0, 1, 0xFF + 3]) == b"\xff"


def test_autotokenizer_loads_saved_file_without_remote_code(tmp_path):
    byte_tokenizer().save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=False)
    assert tokenizer("ab</s>")["input_ids"] == [100, 101] + [b + 3 for b in b"</s>"]
    batch = tokenizer(["ab", "abcd"], padding=True)  # on the left, as saved
    assert batch["input_ids"][0] == [0, 0, 100, 101] and batch["attention_mask"][0] == [0, 0, 1, 1]


@torch.no_grad()
def test_a_batch_padded_as_the_tokenizer_pads_it_generates_what_each_prompt_does_alone():
    """The everyday call, tokenizer(prompts, padding=True) then generate, with no padding side named: each row goes
    on from its own last byte, with the same bytes and scores as alone. Control: padded on the right, the short row
    is continued from its last column, a pad, whose prediction is not that of its last byte."""
    tokenizer = byte_tokenizer()
    model = tiny_model(std=0.3, eos_token_id=None)
    prompts = ["the cat sat on the mat", "a dog"]
    settings = dict(max_new_tokens=12, do_sample=False, return_dict_in_generate=True, output_scores=True)
    alone = [model.generate(**tokenizer(p, return_tensors="pt"), **settings) for p in prompts]
    assert tokenizer.padding_side == "left"
    for padding, same in ((None, True), ("right", False)):
        batch = model.generate(**tokenizer(prompts, return_tensors="pt", padding=True, padding_side=padding),
                               **settings)
        for i, row in enumerate(alone):
            assert torch.equal(batch.sequences[i, -12:], row.sequences[0, -12:]) or not same
            assert torch.allclose(batch.scores[0][i], row.scores[0][0], atol=1e-5) == (same or i == 0)
