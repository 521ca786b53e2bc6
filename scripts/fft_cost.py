"""Cost of the Fourier read's N-point FFT for the value table's period N (KathleenConfig.fourier_period).

    python scripts/fft_cost.py [--periods 259 288] [--rows 2048] [--repeats 50] [--threads 1] [--seed 0]

Times torch.fft.fft over [rows, N] complex64 (random, from --seed), the shape of the read of `rows`
positions, as the median of --repeats calls per period, the periods interleaved so machine noise hits all
alike; prints ms per call and the ratio to the first period.
"""

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--periods", type=int, nargs="+", default=[259, 288])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(args.seed)
    inputs = {n: torch.randn(args.rows, n, dtype=torch.complex64, generator=generator) for n in args.periods}
    times = {n: [] for n in args.periods}
    for _ in range(args.repeats + 3):
        for n, x in inputs.items():
            start = time.perf_counter()
            torch.fft.fft(x, dim=-1)
            times[n].append(time.perf_counter() - start)
    first = statistics.median(times[args.periods[0]][3:])
    print(f"{args.threads} thread(s), seed {args.seed}, [{args.rows}, N] complex64, median of {args.repeats} calls")
    for n in args.periods:
        median = statistics.median(times[n][3:])
        print(f"  N = {n}: {median * 1e3:.3f} ms ({median / first:.2f}x N = {args.periods[0]})")


if __name__ == "__main__":
    main()
