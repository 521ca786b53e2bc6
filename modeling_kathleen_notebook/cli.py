"""The `kathleen-notebook` command line. Each subcommand is one function; later work adds more.

    kathleen-notebook smoke                         a one-minute tour of the modules, untrained
    kathleen-notebook train CONFIG [k=v ...]         train (under `accelerate launch` for several processes)
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from .cache import KathleenCache
from .configuration_kathleen import KathleenConfig
from .modeling_kathleen import KathleenForCausalLM
from .needle import make_needle_example
from .tokenization_kathleen import byte_tokenizer


def smoke(args: argparse.Namespace) -> None:
    """Untrained model: the notebook's one-shot recall at 1x-8x lengths, generation, cache on disk."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = KathleenConfig(forgetting=False)
    model = KathleenForCausalLM(config).eval()
    print(f"KathleenForCausalLM: {sum(p.numel() for p in model.parameters()):,} parameters "
          f"(notebook {config.notebook_parameter_count:,}), seed {args.seed}, {args.threads} thread(s)")

    print("\nUntrained notebook, oracle write mask, memory-only read-out (SPEC §6.1 haystacks):")
    rng = random.Random(args.seed)
    for length in (512, 2048, 4096):
        for n_needles in (1, 5):
            accuracies = []
            for _ in range(args.trials):
                example = make_needle_example(length, rng, n_needles=n_needles)
                with torch.no_grad():
                    out = model(example.input_ids[None], write_mask=example.write_mask()[None], use_cache=False)
                accuracies.append(example.value_accuracy(out.memory_logits[0]))
            print(f"  {length:>5} bytes, {n_needles} needle(s): value-byte recall "
                  f"{sum(accuracies) / len(accuracies):.3f} over {args.trials} haystacks (chance 1/26)")

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


def train_command(args: argparse.Namespace) -> None:
    """Train from a JSON config with section.key=value overrides; --resume continues the newest checkpoint."""
    import logging

    from .training import load_training_config, train

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = load_training_config(args.config, args.overrides)
    output = train(config, resume=args.resume)
    print(f"done: {output}/final (model), {output}/metrics.jsonl, {output}/curves.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kathleen-notebook", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    tour = commands.add_parser("smoke", help="a one-minute tour of the modules on an untrained model")
    tour.add_argument("--seed", type=int, default=42)
    tour.add_argument("--threads", type=int, default=1)
    tour.add_argument("--trials", type=int, default=10)
    tour.set_defaults(run=smoke)
    trainer = commands.add_parser("train", help="train a model from a JSON config (see configuration/presets)")
    trainer.add_argument("config", help="a training config, e.g. configuration/presets/text-notebook.json")
    trainer.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.steps=200 model.memory=none")
    trainer.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    trainer.set_defaults(run=train_command)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
