"""How much a checkpoint's notebook writes on plain text: the write strengths β of one stretch of a corpus.

    python scripts/write_strengths.py MODEL [--data ../shared/data/enwiki_excerpt.xml] [--byte-range 5180771 5197155]

Prints mean β, Σβ² (the crosstalk a read sees grows with it: σ² ≈ Σβ² / R), quantiles and the share of bytes
written above 0.5 and 0.9, for the bytes read as one document (memory empty at its start). 1 thread, no sampling.
"""

from __future__ import annotations

import argparse

import torch

from modeling_kathleen_notebook import KathleenForCausalLM
from modeling_kathleen_notebook.tokenization_kathleen import bytes_to_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--data", default="../shared/data/enwiki_excerpt.xml")
    parser.add_argument("--byte-range", type=int, nargs=2, default=[5_180_771, 5_180_771 + 16_384],
                        metavar=("START", "END"), help="default: the first 16 KB of the validation slice")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start, end = args.byte_range
    text = open(args.data, "rb").read()[start:end]
    if not text:
        raise SystemExit(f"--byte-range {start} {end} holds no bytes of {args.data}")
    try:
        model = KathleenForCausalLM.from_pretrained(args.model).eval()
    except (OSError, ValueError) as error:
        raise SystemExit(f"cannot load {args.model}: {str(error).splitlines()[0]}") from None
    if model.config.memory != "notebook":
        raise SystemExit(f"{args.model} has no notebook (memory={model.config.memory!r})")
    with torch.no_grad():
        beta = model(bytes_to_ids(text)[None], output_write_strengths=True, logits_to_keep=1).write_strengths[0]
    quantiles = torch.quantile(beta, torch.tensor([0.5, 0.9, 0.99]))
    print(f"{args.model}: {len(text):,} bytes of {args.data} [{start}, {end}), R = {model.config.hrr_dim:,}")
    print(f"  mean beta {beta.mean():.4f}, sum of beta^2 {beta.square().sum():,.1f}, "
          f"median / 90th / 99th percentile {' / '.join(f'{q:.3f}' for q in quantiles)}")
    print(f"  share of bytes written above 0.5: {(beta > 0.5).float().mean():.3f}, above 0.9: "
          f"{(beta > 0.9).float().mean():.3f}")


if __name__ == "__main__":
    main()
