"""Benchmarks against parameter-matched Mamba and Llama-style transformers, all in one process
(prefill memory in one fresh subprocess per model), written to reports/bench.md and a PNG.

    python scripts/bench.py [--threads 1] [--seed 42] [--contexts 1024 4096 16384 65536] [--steps 5] [--device cpu]

- training: bytes/s of forward + backward + AdamW, batch 16 x 512 random bytes, median of --steps
  steps after 2 warm-up steps, arms interleaved so machine noise hits all alike;
- decoding: median per-byte latency of 128 single-byte steps following a context of each length (the
  models take turns in 4 runs of 48 steps, the first 16 of each run not timed: right after the
  transformer's turn at a long context our steps are slower for a while), and the cache size in bytes;
- prefill of the longest context: wall time and peak RSS growth of a fresh process;
- streaming evaluation (scoring.byte_bits) of 1,000 and 1,000,000 bytes: peak RSS of a fresh process each.
Baselines come from Transformers' own classes (MambaForCausalLM, LlamaForCausalLM) with the 259-byte
vocabulary, sized to our notebook model's parameter count; Mamba runs its plain-PyTorch path (no CUDA
kernels on a CPU) with Transformers' parallel scan (use_mambapy; the mambapy package, in the
`experiments` extra), which trains far faster than its sequential loop.

--device cuda runs the same comparison on a GPU (every timing waits for the device; peak memory is the CUDA
allocator's high-water mark instead of RSS) and writes reports/bench_cuda by default.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM

from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
from modeling_kathleen_notebook.allocator import keep_freed_memory
from modeling_kathleen_notebook.configuration_kathleen import KR_NOTEBOOK
from modeling_kathleen_notebook.experiments.mqar import state_bytes
from modeling_kathleen_notebook.kernels import notebook_path
from modeling_kathleen_notebook.scoring import byte_bits

DECODE_ROUNDS, DECODE_RUN, DECODE_WARMUP = 4, 48, 16  # 128 timed steps per model and context
SPECIALS = dict(vocab_size=259, pad_token_id=0, eos_token_id=1, bos_token_id=1, tie_word_embeddings=False)


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def matched(build, widths, target: int):
    """The model from `build(width)` whose parameter count is closest to target."""
    return min((build(w) for w in widths), key=lambda m: abs(parameters(m) - target))


def build_models(seed: int, only: str | None = None) -> dict:
    """All five models (or just `only`), built after seeding; the baselines sized to our notebook model."""
    torch.manual_seed(seed)
    models = {name: KathleenForCausalLM(KathleenConfig(memory=memory, **KR_NOTEBOOK))
              for name, memory in (("trunk", "none"), ("trunk+notebook", "notebook"), ("trunk+attention", "attention"))
              if only in (None, name, "mamba", "llama")}
    target = parameters(models["trunk+notebook"])
    if only in (None, "mamba"):
        models["mamba"] = matched(lambda h: MambaForCausalLM(MambaConfig(
            hidden_size=h, num_hidden_layers=2, use_mambapy=True, **SPECIALS)), range(64, 161, 8), target)
    if only in (None, "llama"):
        models["llama"] = matched(lambda h: LlamaForCausalLM(LlamaConfig(
            hidden_size=h, intermediate_size=4 * h, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=1 << 17, **SPECIALS)), range(48, 129, 8), target)  # even head width (RoPE)
    return models if only is None else {only: models[only]}


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a wall-clock timer measures it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def training_rates(models: dict, steps: int, seed: int, device: torch.device) -> dict:
    data = torch.randint(3, 259, (16, 512), generator=torch.Generator().manual_seed(seed)).to(device)
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    times = {name: [] for name in models}
    for i in range(2 + steps):
        for name, model in models.items():
            model.train()
            start = time.perf_counter()
            model(data, labels=data, use_cache=False).loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            synchronize(device)
            if i >= 2:
                times[name].append(time.perf_counter() - start)
    return {name: data.numel() / statistics.median(t) for name, t in times.items()}


@torch.no_grad()
def prefill(model, ids: torch.Tensor, chunk: int = 4096):
    """Read ids into a cache (in chunks for ours, whole for the baselines, which is how each is used)."""
    model.eval()
    if isinstance(model, KathleenForCausalLM):
        cache = None
        for start in range(0, ids.shape[1], chunk):
            cache = model(ids[:, start:start + chunk], cache=cache, logits_to_keep=1).cache
        return cache
    return model(ids, use_cache=True, logits_to_keep=1).cache


@torch.no_grad()
def decode_latencies(models: dict, context: int, seed: int, device: torch.device) -> dict:
    """Per model: the median per-byte time of single-byte steps following a context, the cache size in
    bytes, and the median of each round (to show how much a ratio moves). The models take turns in
    DECODE_ROUNDS rounds of DECODE_RUN steps each (the first DECODE_WARMUP of a run not counted), so a slow
    spell of the machine hits all of them alike while each decodes warm, as it would alone (the first steps
    after another model's turn are slower: caches)."""
    steps = DECODE_ROUNDS * DECODE_RUN
    ids = torch.randint(3, 259, (1, context + steps), generator=torch.Generator().manual_seed(seed)).to(device)
    caches = {name: prefill(model, ids[:, :context]) for name, model in models.items()}
    synchronize(device)
    rounds = {name: [] for name in models}  # per model, per round: the timed steps
    for first in range(context, context + steps, DECODE_RUN):
        for name, model in models.items():
            rounds[name].append([])
            for i, t in enumerate(range(first, first + DECODE_RUN)):
                start = time.perf_counter()
                caches[name] = model(ids[:, t:t + 1], cache=caches[name], use_cache=True).cache
                synchronize(device)
                if i >= DECODE_WARMUP:
                    rounds[name][-1].append(time.perf_counter() - start)
    return {name: (statistics.median([t for run in timed for t in run]), state_bytes(caches[name]),
                   [statistics.median(run) for run in timed]) for name, timed in rounds.items()}


def peak_memory(device: torch.device) -> int:
    """This process's high-water mark in bytes: resident memory on the CPU (VmHWM: unlike ru_maxrss, not inherited
    across exec), the CUDA allocator's peak on a GPU."""
    if device.type == "cuda":
        synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def in_fresh_process(option: str, value, args) -> dict:
    """Run this script with `option value` (--prefill-only or --streaming-only) in a new process: its JSON line."""
    command = [sys.executable, __file__, option, str(value), "--seed", str(args.seed), "--threads", str(args.threads),
               "--device", args.device, "--contexts", str(max(args.contexts))]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--prefill-only", help=argparse.SUPPRESS)
    parser.add_argument("--streaming-only", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--streaming", type=int, nargs=2, default=[1_000, 1_000_000],
                        help="text lengths of the streaming-evaluation memory comparison")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (the GPU comparison; needs a CUDA device)")
    parser.add_argument("--out", help="report path without suffix (default reports/bench, or reports/bench_cuda)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    args.out = args.out or ("reports/bench" if device.type == "cpu" else f"reports/bench_{device.type}")
    torch.set_num_threads(args.threads)
    if args.prefill_only:  # a fresh process: one model, one prefill, its peak memory (default allocator)
        model = build_models(args.seed, only=args.prefill_only)[args.prefill_only].to(device)
        ids = torch.randint(3, 259, (1, args.contexts[0]), generator=torch.Generator().manual_seed(args.seed))
        ids = ids.to(device)
        before = peak_memory(device)
        start = time.perf_counter()
        prefill(model, ids)
        synchronize(device)
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "peak_bytes": peak_memory(device) - before}))
        return
    if args.streaming_only:  # a fresh process: the streaming scorer over N random bytes, its peak memory
        model = build_models(args.seed, only="trunk+notebook")["trunk+notebook"].eval().to(device)
        ids = torch.randint(3, 259, (args.streaming_only,), generator=torch.Generator().manual_seed(args.seed))
        before = peak_memory(device)
        start = time.perf_counter()
        byte_bits(model, ids)
        synchronize(device)
        print(json.dumps({"seconds": time.perf_counter() - start, "peak_bytes": peak_memory(device),
                          "peak_growth_bytes": peak_memory(device) - before}))
        return
    keep_freed_memory()
    models = {name: model.to(device) for name, model in build_models(args.seed).items()}

    sizes = {name: parameters(m) for name, m in models.items()}
    print(f"device {device}, threads {args.threads}, seed {args.seed}; parameters {sizes}", flush=True)
    rates = training_rates(models, args.steps, args.seed, device)
    print("training bytes/s", {k: round(v) for k, v in rates.items()}, flush=True)
    decoding = {}
    decoders = {name: models[name] for name in ("trunk+notebook", "mamba", "llama")}
    for context in args.contexts:
        for name, measured in decode_latencies(decoders, context, args.seed, device).items():
            decoding[name, context] = measured
            print(f"decode {name} after {context}: {measured[0] * 1e3:.2f} ms/byte, cache {measured[1]:,} bytes",
                  flush=True)
    longest = max(args.contexts)
    prefills = {name: in_fresh_process("--prefill-only", name, args) for name in ("trunk+notebook", "mamba", "llama")}
    print("prefill", prefills, flush=True)
    streaming = {n: in_fresh_process("--streaming-only", n, args) for n in args.streaming}
    print("streaming", streaming, flush=True)
    write_report(args, sizes, rates, decoding, prefills, longest, streaming)


def memory_name(device: str) -> str:
    return "peak RSS" if device == "cpu" else "peak CUDA memory"


def streaming_lines(streaming: dict, device: str) -> list[str]:
    """The streaming-evaluation memory table: whole-process peak and growth above the loaded model."""
    short, long = sorted(streaming)
    lines = ["", "## Streaming evaluation memory (scoring.byte_bits, default chunk, fresh process each)", "",
             f"| text bytes | seconds | {memory_name(device)} (whole process) | peak growth while scoring |",
             "|---|---|---|---|"]
    for n in (short, long):
        s = streaming[n]
        lines.append(f"| {n:,} | {s['seconds']:.1f} | {s['peak_bytes'] / 2**20:,.0f} MiB | "
                     f"{s['peak_growth_bytes'] / 2**20:,.1f} MiB |")
    ratio = streaming[long]["peak_bytes"] / streaming[short]["peak_bytes"]
    lines += ["", f"Peak memory of the {long:,}-byte evaluation is {ratio:.2f}x that of the {short:,}-byte one "
              f"(target <= 2x). The growth includes the O(N) input ids and per-byte outputs "
              f"({long * 20 / 2**20:.0f} MiB at {long:,} bytes); the model's state is constant."]
    return lines


def target_lines(rates: dict, decoding: dict, contexts: list[int], streaming: dict, device: str) -> list[str]:
    """Issue 9's four targets, each with the measured value and whether it was met: they were set for one CPU
    thread, so on another device the values are shown without a verdict."""
    def verdict(met: bool) -> str:
        return ("met" if met else "missed") if device == "cpu" else f"not judged on {device}"

    cost = rates["trunk"] / rates["trunk+notebook"]
    ours = [decoding["trunk+notebook", c][0] for c in contexts]
    at = 16384 if 16384 in contexts else max(contexts)
    speedup = decoding["llama", at][0] / decoding["trunk+notebook", at][0]
    per_round = [theirs / ours for theirs, ours in zip(decoding["llama", at][2], decoding["trunk+notebook", at][2])]
    short, long = sorted(streaming)
    memory = streaming[long]["peak_bytes"] / streaming[short]["peak_bytes"]
    lines = ["", "## Targets (issue 9" + ("" if device == "cpu" else ", set for one CPU thread") + ")", "",
             f"- training cost of trunk + notebook: {cost:.2f}x the bare trunk "
             f"(target <= 1.5x: {verdict(cost <= 1.5)})"]
    for baseline in ("mamba", "llama"):
        ratio = rates["trunk+notebook"] / rates[baseline]
        lines.append(f"- training throughput: {ratio:.2f}x the parameter-matched {baseline} "
                     f"(target >= 1x: {verdict(ratio >= 1)})")
    lines += [f"- decoding after {at:,} bytes: {speedup:.2f}x faster per byte than llama with its KV cache, "
              f"{min(per_round):.2f}x to {max(per_round):.2f}x in its {len(per_round)} rounds "
              f"(target >= 5x: {verdict(speedup >= 5)})",
              f"- decoding from {min(contexts):,} to {max(contexts):,} bytes: slowest / fastest = "
              f"{max(ours) / min(ours):.2f} (target within 20%: {verdict(max(ours) / min(ours) <= 1.2)})",
              f"- streaming evaluation memory: {memory:.2f}x (target <= 2x: {verdict(memory <= 2)})"]
    return lines


def write_report(args, sizes, rates, decoding, prefills, longest, streaming) -> None:
    out = Path(args.out)
    out.parent.mkdir(exist_ok=True)
    base = rates["trunk"]
    scan_path = notebook_path() if args.device == "cpu" else "PyTorch ops (the compiled kernels are CPU-only)"
    where = "CPU" if args.device == "cpu" else f"{torch.cuda.get_device_name(args.device)} ({args.device})"
    lines = ["# Benchmarks", "", f"`python {' '.join(sys.argv)}` — {where}, {args.threads} thread(s), "
             f"seed {args.seed}, "
             "glibc allocator tuned (allocator.py); all models in one process, random bytes; the notebook's "
             f"scan and read: {scan_path}.", "",
             "## Training (forward + backward + AdamW, batch 16 x 512)", "",
             "| model | parameters | bytes/s | cost vs trunk |", "|---|---|---|---|"]
    for name, rate in rates.items():
        lines.append(f"| {name} | {sizes[name]:,} | {rate:,.0f} | {base / rate:.2f}x |")
    lines += ["", "## Decoding: per-byte latency after a context, and cache size", "",
              "| model | " + " | ".join(f"{c:,}" for c in args.contexts) + " | cache at the longest |",
              "|---|" + "---|" * (len(args.contexts) + 1)]
    for name in ("trunk+notebook", "mamba", "llama"):
        lines.append(f"| {name} | " + " | ".join(f"{decoding[name, c][0] * 1e3:.2f} ms" for c in args.contexts)
                     + f" | {decoding[name, longest][1]:,} bytes |")
    lines += ["", f"## Prefill of {longest:,} bytes (fresh process each)", "",
              f"| model | seconds | {memory_name(args.device)} growth |", "|---|---|---|"]
    for name, p in prefills.items():
        lines.append(f"| {name} | {p['seconds']:.1f} | {p['peak_bytes'] / 2**20:,.0f} MiB |")
    lines += streaming_lines(streaming, args.device)
    lines += target_lines(rates, decoding, args.contexts, streaming, args.device)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    figure, (decode_axis, train_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("trunk+notebook", "mamba", "llama"):
        decode_axis.plot(args.contexts, [decoding[name, c][0] * 1e3 for c in args.contexts], "o-", label=name)
    decode_axis.set_xscale("log", base=2)
    decode_axis.set_yscale("log")  # ours and Mamba sit on top of each other on a linear axis
    decode_axis.yaxis.set_major_formatter(ScalarFormatter())
    decode_axis.yaxis.set_minor_formatter(ScalarFormatter())
    decode_axis.set_xlabel("context (bytes)")
    decode_axis.set_ylabel("ms per decoded byte")
    decode_axis.set_title("decoding after a context")
    decode_axis.grid(alpha=0.3, which="both")
    decode_axis.legend()
    train_axis.barh(list(rates), [r / 1e3 for r in rates.values()], color="tab:gray")
    train_axis.invert_yaxis()
    train_axis.set_xlabel("training throughput (thousand bytes/s, batch 16 x 512)")
    train_axis.set_title("training (forward + backward + AdamW)")
    figure.suptitle(f"python {' '.join(sys.argv)}  ({args.threads} thread(s), seed {args.seed})", fontsize=9)
    figure.tight_layout()
    figure.savefig(out.with_suffix(".png"), dpi=120)
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
