"""The byte tokenizer: pad 0, eos 1, unk 2, byte b -> b + 3, no merges, nothing appended on encode.

It is a plain `tokenizer.json` (GPT-2's byte-to-unicode alphabet, a BPE with no merges), so
`AutoTokenizer` loads it without remote code. Special tokens are never matched inside text: the literal string
"</s>" encodes as its four bytes. Invalid UTF-8 decodes to U+FFFD. It pads on the left, so a batch of prompts
padded with `tokenizer(prompts, padding=True)` generates what each prompt alone does (`generate` continues a row
from its last column: after a right-padded row's pads).
"""

from __future__ import annotations

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from .configuration_kathleen import BYTE_OFFSET

SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in character for each byte 0..255 (what the ByteLevel pre-tokenizer emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    stand_in, extra = {}, 0
    for b in range(256):
        if b in printable:
            stand_in[b] = chr(b)
        else:
            stand_in[b] = chr(256 + extra)
            extra += 1
    return [stand_in[b] for b in range(256)]


def byte_tokenizer(model_max_length: int = 1 << 30) -> PreTrainedTokenizerFast:
    """The tokenizer every Kathleen checkpoint ships as tokenizer.json."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({char: b + BYTE_OFFSET for b, char in enumerate(byte_alphabet())})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True) for token in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="</s>",
        bos_token="</s>",  # the document separator doubles as the prefix token lm-eval prepends
        unk_token="<unk>",
        split_special_tokens=True,
        model_max_length=model_max_length,
        padding_side="left",  # generation continues every row from its end
    )


def bytes_to_ids(data: bytes) -> torch.Tensor:
    """Token ids of raw bytes without the tokenizer (for corpora of many megabytes). [len(data)] long."""
    if not data:
        return torch.zeros(0, dtype=torch.long)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long() + BYTE_OFFSET


def ids_to_bytes(ids: torch.Tensor | list[int]) -> bytes:
    """The bytes of byte ids; special ids are dropped."""
    values = ids.tolist() if isinstance(ids, torch.Tensor) else ids
    return bytes(i - BYTE_OFFSET for i in values if i >= BYTE_OFFSET)
