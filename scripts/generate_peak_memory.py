"""Peak resident memory of one greedy generation: a prompt of the first N bytes of a file, then M new bytes.

    python scripts/generate_peak_memory.py [MODEL] [--prompt README.md] [--prompt-bytes 4096] [--new-bytes 64]

MODEL defaults to the shipped checkpoint; 1 thread. Prints the process's peak RSS (ru_maxrss, Linux: KiB), which
includes Python, torch and the loaded weights.
"""

from __future__ import annotations

import argparse
import resource
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from modeling_kathleen_notebook.session import DEFAULT_CHECKPOINT
from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=str(DEFAULT_CHECKPOINT))
    parser.add_argument("--prompt", default="README.md", help="a file whose first --prompt-bytes bytes are the prompt")
    parser.add_argument("--prompt-bytes", type=int, default=4096)
    parser.add_argument("--new-bytes", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model, trust_remote_code=True).eval()
    try:
        prompt = Path(args.prompt).read_bytes()[:args.prompt_bytes]
    except OSError as error:
        raise SystemExit(f"--prompt {args.prompt}: {error.strerror}") from None
    if not prompt:
        raise SystemExit(f"{args.prompt}: empty, nothing to prompt with")
    model.generate(bytes_to_ids(prompt).unsqueeze(0), max_new_tokens=args.new_bytes, do_sample=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{args.model}: {len(prompt):,}-byte prompt + {args.new_bytes} new bytes, 1 thread: peak RSS "
          f"{peak / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
