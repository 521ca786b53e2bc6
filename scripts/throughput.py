"""Training throughput (forward + backward) of the bare trunk and trunk + notebook, in one process.

Defaults (SPEC §8 / issue 2): needle trunk d=96 x 2 blocks, batch 16 x 512 random bytes, 1 thread,
seed 42, 3 warm-up and 7 timed steps per arm, arms interleaved so machine noise hits both alike.
Prints bytes/s per arm (median) and the ratio notebook / trunk, then where the notebook's share of a step goes:
median milliseconds of its keys as binding forms them (bundled: row sums and norms in one compiled pass,
kernels.cpp's `bundled_keys`, or PyTorch's embedding bag without the kernels; bound: the turns and their roots in
PyTorch, which the compiled scan forms inside its loops instead, so a step there does not pay them), its write gate
(forward + backward) where it has one, its read trust where it has one (forward + backward, compiled and as PyTorch
ops), and its scan and read (forward, backward), each timed alone on the same batch.

    python scripts/throughput.py [--threads 1] [--batch 16] [--length 512] [--steps 7] [--notebook kr|defaults]
        [--repeat-key-window 4]

--notebook kr (the default here, as in scripts/bench.py) is [KR]'s notebook, `KR_NOTEBOOK` (bundled keys over 7
bytes, the gate, forgetting); --notebook defaults is KathleenConfig's own (bound keys over 16 bytes, surprise
writes, the read trust), what `kathleen-notebook train` builds unless a preset says otherwise.
--repeat-key-window W' gives the notebook a repeat bank (bound keys only: with --notebook defaults); the parts below
time its first memory.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
from modeling_kathleen_notebook.allocator import keep_freed_memory
from modeling_kathleen_notebook.configuration_kathleen import KR_NOTEBOOK
from modeling_kathleen_notebook.kernels import notebook_path
from modeling_kathleen_notebook.notebook import Notebook
from modeling_kathleen_notebook.scan_read import scan_and_read_chunked


def median_ms(run, steps: int, warmup: int) -> float:
    """Median wall time of run() in milliseconds over `steps` calls after `warmup` untimed ones."""
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        run()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def notebook_parts(notebook: Notebook, data: torch.Tensor, steps: int, warmup: int) -> dict[str, float]:
    """Median ms of the notebook's parts of one training step on `data` [B, T], each timed alone."""
    T = data.shape[1]
    grad = torch.randn(*data.shape, notebook.config.vocab_size, generator=torch.Generator().manual_seed(0))
    trunk_logits = grad  # any logits: what the surprise makes of them does not change the cost
    (tables, ids_with_tail, beta, keep, _, weights), _ = notebook.operation_inputs(data, None, None, None, trunk_logits)
    beta, keep, weights = (x.detach().requires_grad_() if x is not None else None
                           for x in (beta, keep, weights.contiguous()))

    def scan_read():
        return scan_and_read_chunked(tables, ids_with_tail, beta, keep, None, weights)

    def scan_read_backward():
        reads, memory = scan_read()
        start = time.perf_counter()
        torch.autograd.backward([reads, memory], [grad, torch.zeros_like(memory)])
        return time.perf_counter() - start

    backward = [scan_read_backward() for _ in range(warmup + steps)][warmup:]
    with torch.no_grad():
        parts = {"keys (as binding forms them)": median_ms(lambda: tables.bind(ids_with_tail, T).keys, steps, warmup)}
    if notebook.gate is not None:
        gate_ids = ids_with_tail[:, -(notebook.config.gate_window - 1 + T):]
        parts["gate (fwd + bwd)"] = median_ms(lambda: notebook.gate(gate_ids).sum().backward(), steps, warmup)
    if notebook.trust is not None:  # on the batch's size: its compiled forward and backward, and its PyTorch ops
        reads = torch.randn_like(grad).requires_grad_()
        trunk = trunk_logits.clone().requires_grad_()
        for name, trust in (("read trust (fwd + bwd)", notebook.trust),
                            ("read trust as PyTorch ops (fwd + bwd)", notebook.trust.forward_reference)):
            parts[name] = median_ms(lambda trust=trust: (trust(reads, trunk) * grad).sum().backward(), steps, warmup)
    return {**parts, "keys + scan/read (fwd)": median_ms(scan_read, steps, warmup),
            "scan and read (bwd)": statistics.median(backward) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--d-model", type=int, default=96)
    parser.add_argument("--n-layers", type=int, default=2)
    parser.add_argument("--value-codebook", default="fourier", choices=["shared", "gaussian", "fourier"])
    parser.add_argument("--notebook", choices=["kr", "defaults"], default="kr", help="which notebook (see above)")
    parser.add_argument("--repeat-key-window", type=int, default=0, help="a repeat bank over this many bytes")
    parser.add_argument("--default-allocator", action="store_true", help="do not keep freed memory (allocator.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tuned = False if args.default_allocator else keep_freed_memory()

    arms = {}
    for memory in ("none", "notebook", "attention"):
        torch.manual_seed(args.seed)
        repeat_bank = {"repeat_key_window": args.repeat_key_window} if memory == "notebook" else {}
        try:
            config = KathleenConfig(d_model=args.d_model, n_layers=args.n_layers, memory=memory,
                                    value_codebook=args.value_codebook, **repeat_bank,
                                    **(KR_NOTEBOOK if args.notebook == "kr" else {}))
        except ValueError as error:
            raise SystemExit(f"throughput.py: {error}") from None
        model = KathleenForCausalLM(config).train()
        arms[memory] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    data = torch.randint(3, 259, (args.batch, args.length), generator=torch.Generator().manual_seed(args.seed))

    def step(model, optimizer) -> float:
        start = time.perf_counter()
        loss = model(data, labels=data, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    times = {name: [] for name in arms}
    for i in range(args.warmup + args.steps):
        for name, (model, optimizer) in arms.items():
            elapsed = step(model, optimizer)
            if i >= args.warmup:
                times[name].append(elapsed)

    bytes_per_step = args.batch * args.length
    print(f"threads={args.threads} batch={args.batch}x{args.length} d_model={args.d_model} "
          f"n_layers={args.n_layers} notebook={args.notebook} repeat_key_window={args.repeat_key_window} "
          f"value_codebook={args.value_codebook} seed={args.seed} "
          f"steps={args.steps} allocator_tuned={tuned} kernels={notebook_path()} (median of timed steps)")
    rate = {}
    for name, (model, _) in arms.items():
        rate[name] = bytes_per_step / statistics.median(times[name])
        params = sum(p.numel() for p in model.parameters())
        print(f"  memory={name:<9} params={params:>8,}  {rate[name]:>9,.0f} bytes/s")
    print(f"  cost ratio trunk+notebook / trunk = {rate['none'] / rate['notebook']:.2f}x")
    print(f"  cost ratio trunk+attention / trunk = {rate['none'] / rate['attention']:.2f}x")
    trunk_ms = bytes_per_step / rate["none"] * 1e3
    share = bytes_per_step / rate["notebook"] * 1e3 - trunk_ms
    print(f"notebook's share of a step: {share:.1f} ms (1.5x the trunk allows {trunk_ms / 2:.1f} ms); "
          "its parts, each timed alone:")
    for part, ms in notebook_parts(arms["notebook"][0].model.memory, data, args.steps, args.warmup).items():
        print(f"  {part:<38} {ms:6.1f} ms")


if __name__ == "__main__":
    main()
