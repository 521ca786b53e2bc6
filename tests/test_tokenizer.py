"""The byte tokenizer: exact ids, nothing appended, special-token text stays bytes, U+FFFD on bad UTF-8."""

from transformers import AutoTokenizer

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
    batch = tokenizer(["ab", "abcd"], padding=True, padding_side="left")
    assert batch["input_ids"][0] == [0, 0, 100, 101] and batch["attention_mask"][0] == [0, 0, 1, 1]
