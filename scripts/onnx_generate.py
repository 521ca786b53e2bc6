"""Greedy decoding with an exported step (`kathleen-notebook export MODEL OUT.onnx`) in onnxruntime, without PyTorch.

    python scripts/onnx_generate.py OUT.onnx --prompt "The capital of Freedonia is" [--cache memory.safetensors]
        [--max-new-tokens 40] [--threads 1]

The state starts empty, or is a cache file written by `KathleenCache.save` (or a `NotebookSession` memory file) of
the same model: a memory read in PyTorch continues here. Needs numpy, onnxruntime and safetensors only. Prints the
continuation and the time per decoded byte.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

BYTE_OFFSET, PAD_ID = 3, 0  # the byte tokenizer: byte b is token b + 3; pad 0


class OnnxDecoder:
    """An exported step in an onnxruntime session: state names and shapes are the graph's inputs."""

    def __init__(self, path: str, threads: int = 1):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.state_names = list(self.inputs)[1:]

    def empty_state(self, batch_size: int) -> dict[str, np.ndarray]:
        """Zeros (pad ids for the notebook's tail): the state before anything was read."""
        state = {}
        for name in self.state_names:
            shape = [batch_size] + list(self.inputs[name].shape[1:])
            if name.endswith(".tail"):
                state[name] = np.full(shape, PAD_ID, dtype=np.int64)
            else:
                state[name] = np.zeros(shape, dtype=np.float32)
        return state

    def state_from_file(self, path: str) -> dict[str, np.ndarray]:
        """A `KathleenCache.save` file (or a session memory file) of this graph's model as its state."""
        from safetensors.numpy import load_file

        tensors = load_file(path)
        missing = [name for name in self.state_names if name not in tensors]
        if missing:
            raise ValueError(f"{path} is not a memory of this graph's model: it lacks {missing}")
        for name in self.state_names:
            expected = list(self.inputs[name].shape[1:])
            if list(tensors[name].shape[1:]) != expected:
                raise ValueError(f"{path}'s {name} has shape {list(tensors[name].shape)}, the graph takes "
                                 f"[batch, {', '.join(map(str, expected))}]: a memory of another model")
        return {name: tensors[name] for name in self.state_names}

    def step(self, ids: np.ndarray, state: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """ids [B, 1] int64 -> (logits [B, V], the state after them)."""
        outputs = self.session.run(None, {"input_ids": ids, **state})
        return outputs[0], dict(zip(self.state_names, outputs[1:]))

    def generate(self, prompt: np.ndarray, max_new_tokens: int, state: dict[str, np.ndarray]) -> np.ndarray:
        """Read prompt ids [B, T] after `state`, then add max_new_tokens greedy ids per row: [B, max_new_tokens]."""
        logits = None
        for t in range(prompt.shape[1]):
            logits, state = self.step(prompt[:, t:t + 1], state)
        new = []
        for _ in range(max_new_tokens):
            ids = logits.argmax(-1).astype(np.int64)[:, None]
            new.append(ids)
            logits, state = self.step(ids, state)
        return np.concatenate(new, axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("graph", help="the .onnx file of `kathleen-notebook export`")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--cache", help="a memory to continue from (KathleenCache.save or a session file)")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not args.prompt:
        parser.error("the prompt is empty")
    try:
        decoder = OnnxDecoder(args.graph, args.threads)
        state = decoder.state_from_file(args.cache) if args.cache else decoder.empty_state(1)
    except Exception as error:  # a missing or foreign graph or memory file: one line that names it
        parser.error(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
    prompt = np.array([[b + BYTE_OFFSET for b in args.prompt.encode()]], dtype=np.int64)
    start = time.perf_counter()
    new = decoder.generate(prompt, args.max_new_tokens, state)
    per_byte = (time.perf_counter() - start) / (prompt.shape[1] + args.max_new_tokens) * 1e3
    text = bytes(i - BYTE_OFFSET for i in new[0] if i >= BYTE_OFFSET).decode("utf-8", "replace")
    print(f"{args.prompt}{text}")
    print(f"({per_byte:.3f} ms per byte, {args.threads} thread(s), onnxruntime)")


if __name__ == "__main__":
    main()
