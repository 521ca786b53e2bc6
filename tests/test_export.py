"""The one-byte step as an ONNX graph (export.py): its real-arithmetic form equals the model, the exported graph
equals PyTorch over 200 steps in onnxruntime in a process without PyTorch, and a memory read in PyTorch continues
there."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_model
from modeling_kathleen_notebook.export import ExportableStep, empty_state, export_step, state_names

pytest.importorskip("onnxruntime", reason="the [export] extra is not installed")
ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "bound keys, surprise, trust": dict(key_binding="bind", write_signal="surprise", read_trust=True),
    "bundled keys, gate": dict(),
    "table read, gate + surprise": dict(value_codebook="gaussian", write_signal="gate+surprise", forgetting=False),
    "bare trunk": dict(memory="none"),
    "repeat bank": dict(key_binding="bind", write_signal="surprise", read_trust=True, key_window=16,
                        repeat_key_window=4),
    "repeat bank, a trust per memory": dict(key_binding="bind", write_signal="surprise", read_trust=True,
                                            key_window=16, repeat_key_window=4, repeat_read_trust=True),
}
# a process in which `import torch` fails: the exported graph must run there
WITHOUT_TORCH = "import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; " \
                "runpy.run_path(sys.argv[0], run_name='__main__')"


def decoded_logits(step, ids: torch.Tensor, state: dict) -> torch.Tensor:
    """ids [B, T] through `step` one byte at a time: logits [B, T, V]."""
    names, outs = list(state), []
    values = list(state.values())
    with torch.no_grad():
        for t in range(ids.shape[1]):
            logits, *values = step(ids[:, t:t + 1], *values)
            outs.append(logits)
    return torch.stack(outs, 1), dict(zip(names, values))


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_real_arithmetic_step_equals_the_model(variant):
    model = tiny_model(std=0.3, **VARIANTS[variant])
    ids = torch.randint(3, 259, (2, 200), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(ids)
    expected = out.logits
    if out.memory_logits is not None:  # control: the memory's share is large enough that leaving it out would show
        assert out.memory_logits.abs().max() > 1e-2
    ours, _ = decoded_logits(ExportableStep(model), ids, empty_state(model.config, 2))
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("variant", ["bound keys, surprise, trust", "bundled keys, gate", "repeat bank",
                                     "repeat bank, a trust per memory"])
def test_exported_graph_continues_a_pytorch_memory_without_pytorch(variant, tmp_path):
    """A memory read in PyTorch, saved with KathleenCache.save, then 200 steps of the exported graph in onnxruntime
    (batch 3, exported at batch 2) in a process where torch cannot be imported: the logits equal PyTorch's."""
    model = tiny_model(std=0.3, **VARIANTS[variant])
    graph = export_step(model, tmp_path / "step.onnx")
    ids = torch.randint(3, 259, (3, 260), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cache = model(ids[:, :60]).cache
        full = model(ids).logits[:, 60:]  # what the 200 steps after the saved memory must give
    cache.save(tmp_path / "memory.safetensors")
    np.save(tmp_path / "ids.npy", ids[:, 60:].numpy())
    code = f"""
import numpy as np
import sys
sys.path.insert(0, {str(ROOT / 'scripts')!r})
from onnx_generate import OnnxDecoder
decoder = OnnxDecoder({str(graph)!r})
state = decoder.state_from_file({str(tmp_path / 'memory.safetensors')!r})
ids = np.load({str(tmp_path / 'ids.npy')!r})
logits = []
for t in range(ids.shape[1]):
    out, state = decoder.step(ids[:, t:t + 1], state)
    logits.append(out)
np.save({str(tmp_path / 'logits.npy')!r}, np.stack(logits, 1))
"""
    script = tmp_path / "run.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, str(script)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ours = torch.from_numpy(np.load(tmp_path / "logits.npy"))
    assert ours.shape == full.shape == (3, 200, 259)
    torch.testing.assert_close(ours, full, rtol=0, atol=1e-4)


def test_a_blocked_torch_is_really_blocked(tmp_path):
    """Control for the test above: the same wrapper makes a script that imports torch fail."""
    script = tmp_path / "uses_torch.py"
    script.write_text("import torch\n")
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, str(script)], capture_output=True, text=True)
    assert done.returncode != 0 and "torch" in done.stderr


def test_the_command_line_exports_and_refuses_bad_input(tmp_path):
    model = tiny_model(key_binding="bind", write_signal="surprise", read_trust=True)
    model.save_pretrained(tmp_path / "model")
    cli = [sys.executable, "-m", "modeling_kathleen_notebook.cli", "export"]
    done = subprocess.run([*cli, str(tmp_path / "step.onnx"), "--model", str(tmp_path / "model")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "onnx_generate.py" in done.stdout and (tmp_path / "step.onnx").exists()
    generate = [sys.executable, str(ROOT / "scripts" / "onnx_generate.py"), str(tmp_path / "step.onnx")]
    done = subprocess.run([*generate, "--prompt", "hello", "--max-new-tokens", "5"], capture_output=True, text=True)
    assert done.returncode == 0 and "ms per byte" in done.stdout, done.stderr[-2000:]
    other = tiny_model(hrr_dim=128)  # a memory of another model: named, not a shape error deep in onnxruntime
    with torch.no_grad():
        other(torch.randint(3, 259, (1, 10))).cache.save(tmp_path / "other.safetensors")
    done = subprocess.run([*generate, "--prompt", "hi", "--cache", str(tmp_path / "other.safetensors")],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "another model" in done.stderr
    attention = tiny_model(memory="attention")
    attention.save_pretrained(tmp_path / "attention")
    done = subprocess.run([*cli, str(tmp_path / "a.onnx"), "--model", str(tmp_path / "attention")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode != 0 and "memory='attention'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("variant", ["bundled keys, gate", "repeat bank"])
def test_state_names_are_the_cache_files_tensors(variant):
    model = tiny_model(**VARIANTS[variant])
    with torch.no_grad():
        tensors, _ = model(torch.randint(3, 259, (2, 9))).cache.to_safetensors()
    state = empty_state(model.config, 2)
    assert list(state) == state_names(model.config)
    for name in state:
        assert tensors[name].shape == state[name].shape and tensors[name].dtype == state[name].dtype, name
