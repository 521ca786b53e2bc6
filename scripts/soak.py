"""Soak test: a long byte stream through generation-style stepping (one byte per call) and through the
streaming scorer, checking that nothing overflows and that the memory stays within its stated bound.

    python scripts/soak.py [--bytes 1000000] [--model FOLDER] [--threads 1] [--seed 0]

Without --model it builds the needle-size model (d 96 x 2 blocks, R 2048) from --seed. Bounds checked
(SPEC §3): with forgetting ‖mem‖₂ ≤ 1/g (unit-norm writes); trunk integrators ≤ max |W_v u|.
"""

import argparse
import time

import torch

from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
from modeling_kathleen_notebook.configuration_kathleen import KR_NOTEBOOK
from modeling_kathleen_notebook.scoring import byte_bits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, default=1_000_000)
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report-every", type=int, default=100_000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = (KathleenForCausalLM.from_pretrained(args.model) if args.model
             else KathleenForCausalLM(KathleenConfig(**KR_NOTEBOOK))).eval()
    ids = torch.randint(3 + 97, 3 + 123, (1, args.bytes), generator=torch.Generator().manual_seed(args.seed))
    g = model.model.memory.forget_rate().item() if model.config.memory == "notebook" else float("nan")
    print(f"{args.bytes:,} random lowercase bytes, seed {args.seed}, {args.threads} thread(s); forget rate g = {g:.4f}"
          f", bound 1/g = {1 / g:.2f}" if g == g and g > 0 else "")
    cache, start, worst = None, time.perf_counter(), 0.0
    with torch.no_grad():
        for t in range(args.bytes):
            out = model(ids[:, t:t + 1], cache=cache)
            cache = out.cache
            if (t + 1) % args.report_every == 0 or t + 1 == args.bytes:
                R = model.config.hrr_dim
                norm = torch.fft.irfft(cache.memory.spectrum[0], n=R).norm().item() if cache.memory is not None else 0
                worst = max(worst, norm)
                finite = torch.isfinite(out.logits).all().item() and all(
                    torch.isfinite(s.integrator).all().item() for s in cache.trunk)
                print(f"  step {t + 1:>9,}: memory norm {norm:8.3f}, finite {finite}, "
                      f"{(t + 1) / (time.perf_counter() - start):,.0f} bytes/s", flush=True)
                if not finite:
                    raise SystemExit("non-finite state")
    if g == g and g > 0 and worst > 1 / g + 1e-3:
        raise SystemExit(f"memory norm {worst:.3f} exceeded the bound 1/g = {1 / g:.3f}")
    start = time.perf_counter()
    bits = byte_bits(model, ids[0], chunk_size=65536)
    print(f"streaming scorer: {bits.mean().item():.4f} bits/byte, finite {torch.isfinite(bits).all().item()}, "
          f"{args.bytes / (time.perf_counter() - start):,.0f} bytes/s")


if __name__ == "__main__":
    main()
