"""`kathleen-notebook smoke`: a one-minute tour of the modules on an untrained model."""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

import torch

from ..cache import KathleenCache
from ..configuration_kathleen import KathleenConfig
from ..modeling_kathleen import KathleenForCausalLM
from ..tokenization_kathleen import byte_tokenizer
from .needle import CONTEXT_BYTES, LETTERS, make_needle_example


def run_smoke(threads: int = 1, seed: int = 42, trials: int = 10) -> None:
    """Untrained model: the notebook's one-shot recall at 1x-8x lengths, generation, cache on disk."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    config = KathleenConfig(forgetting=False, key_window=CONTEXT_BYTES)
    model = KathleenForCausalLM(config).eval()
    print(f"KathleenForCausalLM: {sum(p.numel() for p in model.parameters()):,} parameters "
          f"(notebook {config.notebook_parameter_count:,}), seed {seed}, {threads} thread(s)")

    print("\nUntrained notebook, oracle write mask, memory-only read-out (SPEC §6.1 haystacks):")
    rng = random.Random(seed)
    for length in (512, 2048, 4096):
        for n_needles in (1, 5):
            accuracies = []
            for _ in range(trials):
                example = make_needle_example(length, rng, n_needles=n_needles)
                with torch.no_grad():
                    out = model(example.input_ids[None], write_mask=example.write_mask()[None], use_cache=False)
                accuracies.append(example.value_accuracy(out.memory_logits[0]))
            print(f"  {length:>5} bytes, {n_needles} needle(s): value-byte recall "
                  f"{sum(accuracies) / len(accuracies):.3f} over {trials} haystacks (chance 1/{len(LETTERS)})")

    tokenizer = byte_tokenizer()
    prompt = tokenizer("The notebook remembers", return_tensors="pt")
    start = time.perf_counter()
    out = model.generate(**prompt, max_new_tokens=32, do_sample=True, top_k=20, return_dict_in_generate=True)
    print(f"\nGenerated 32 bytes in {time.perf_counter() - start:.2f}s (untrained, so noise): "
          f"{tokenizer.decode(out.sequences[0])!r}")

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "memory.safetensors"
        out.cache.save(path)
        restored = KathleenCache.load(path, config)
        print(f"Cache saved and reloaded: {path.stat().st_size:,} bytes on disk after "
              f"{restored.get_seq_length()} bytes read (constant in length)")
