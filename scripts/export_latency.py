"""Per-byte decoding time of the exported step in onnxruntime against the PyTorch step, same model, same process.

    python scripts/export_latency.py [--model CHECKPOINT] [--steps 300] [--rounds 3] [--threads 1] [--seed 0]

The model is --model, or a default KathleenConfig model built from --seed. Both read the same 256 random bytes
(PyTorch's prefill; the exported state then continues from PyTorch's cache), then take --steps single bytes;
rounds alternate between the two so that machine noise hits both alike. Prints the median ms per byte of each
round and the ratio.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_generate import OnnxDecoder  # noqa: E402

from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM  # noqa: E402
from modeling_kathleen_notebook.configuration_kathleen import KR_NOTEBOOK  # noqa: E402
from modeling_kathleen_notebook.export import export_step  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = (KathleenForCausalLM.from_pretrained(args.model) if args.model
             else KathleenForCausalLM(KathleenConfig(**KR_NOTEBOOK)))
    model = model.eval()
    ids = torch.randint(3, 259, (1, 256 + args.steps), generator=torch.Generator().manual_seed(args.seed))
    with torch.no_grad():
        cache = model(ids[:, :256]).cache
    with tempfile.TemporaryDirectory() as folder:
        graph = export_step(model, Path(folder) / "step.onnx")
        cache.save(Path(folder) / "memory.safetensors")
        decoder = OnnxDecoder(str(graph), args.threads)
        start_state = decoder.state_from_file(str(Path(folder) / "memory.safetensors"))
        steps = ids[:, 256:].numpy()

        def onnx_round() -> float:
            state, times = start_state, []
            for t in range(args.steps):
                start = time.perf_counter()
                _, state = decoder.step(steps[:, t:t + 1], state)
                times.append(time.perf_counter() - start)
            return statistics.median(times) * 1e3

        def torch_round() -> float:
            import copy

            state, times = copy.deepcopy(cache), []
            with torch.no_grad():
                for t in range(args.steps):
                    start = time.perf_counter()
                    state = model(ids[:, 256 + t:257 + t], cache=state).cache
                    times.append(time.perf_counter() - start)
            return statistics.median(times) * 1e3

        results = {"pytorch": [], "onnxruntime": []}
        for _ in range(args.rounds):
            results["pytorch"].append(torch_round())
            results["onnxruntime"].append(onnx_round())
    name = args.model or f"KathleenConfig(**KR_NOTEBOOK) seed {args.seed}"
    print(f"{name}: R = {model.config.hrr_dim}, {model.config.key_binding} keys; {args.threads} thread(s), "
          f"{args.steps} single-byte steps after 256 bytes, median per round")
    for runtime, values in results.items():
        print(f"  {runtime:<12} " + " / ".join(f"{v:.3f}" for v in values) + " ms/byte")
    ratio = statistics.median(results["onnxruntime"]) / statistics.median(results["pytorch"])
    print(f"  onnxruntime / pytorch = {ratio:.2f}")


if __name__ == "__main__":
    main()
