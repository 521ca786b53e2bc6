"""The compiled CPU kernel of the scan and Fourier read (kernels.py) equals the PyTorch blocks it replaces, in
values and gradients (fp32, both paths); without a compiler the PyTorch path runs."""

import pytest
import torch

from conftest import run_fresh_python
from modeling_kathleen_notebook import scan_read
from modeling_kathleen_notebook.kernels import fourier_kernels


def scan_read_with_gradients(bindings, beta, keep, reader, memory, rho, grads_of):
    """Reads, end memory, and the gradients of β, keep, the start memory and ρ for random output weights."""
    inputs = [x.clone().requires_grad_() for x in (beta, keep, memory, rho)]
    reads, end = scan_read.scan_and_read(bindings, inputs[0], inputs[1], reader, inputs[2], True, chunk_size=64,
                                         read_weights=inputs[3])
    weights, end_weights = grads_of
    loss = (reads * weights).sum() + (torch.view_as_real(end) * end_weights).sum()
    return [reads, end, *torch.autograd.grad(loss, inputs)]


@pytest.mark.parametrize("T", [1, 7, 300])
def test_compiled_scan_and_read_equals_the_pytorch_blocks(T, monkeypatch):
    """Chunks of 64 positions with forgetting (a start state and strided chunk views), B = 3, fp32."""
    assert fourier_kernels() is not None, "the CPU kernel did not build (see the log): a compiler and ninja?"
    g = torch.Generator().manual_seed(T)
    B, Fq, V, N = 3, 33, 11, 16
    scales = torch.rand(B, T + 1, generator=g) + 0.5
    scales[0, 0] = 0.0  # a key of padding only
    bindings = scan_read.Bindings(torch.randn(B, T + 1, Fq, generator=g, dtype=torch.complex64), scales,
                                  torch.randint(0, V, (B, T), generator=g),
                                  torch.randn(V, Fq, generator=g, dtype=torch.complex64))
    reader = scan_read.FourierReadOut(torch.randint(0, N, (Fq,), generator=g), N, V, gain=0.3)
    beta, rho = torch.rand(B, T, generator=g), torch.rand(B, T, generator=g) + 0.5
    keep = 0.8 + 0.2 * torch.rand(B, T, generator=g)
    memory = torch.randn(B, Fq, generator=g, dtype=torch.complex64)
    grads_of = torch.randn(B, T, V, generator=g), torch.randn(B, Fq, 2, generator=g)
    args = bindings, beta, keep, reader, memory, rho, grads_of

    assert scan_read.compiled_kernels(reader, bindings.keys) is not None
    compiled = scan_read_with_gradients(*args)
    monkeypatch.setenv("KATHLEEN_NOTEBOOK_KERNELS", "0")
    assert scan_read.compiled_kernels(reader, bindings.keys) is None
    blocks = scan_read_with_gradients(*args)
    for ours, theirs in zip(compiled, blocks):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4 * theirs.abs().max().item())


def test_only_the_fourier_read_of_complex64_spectra_on_a_cpu_is_compiled():
    g = torch.Generator().manual_seed(0)
    fourier = scan_read.FourierReadOut(torch.randint(0, 16, (9,), generator=g), 16, 11, gain=1.0)
    table = scan_read.TableReadOut(torch.randn(18, 11, generator=g))
    keys = torch.randn(2, 5, 9, dtype=torch.complex64)
    assert scan_read.compiled_kernels(fourier, keys) is not None
    assert scan_read.compiled_kernels(table, keys) is None
    assert scan_read.compiled_kernels(fourier, keys.to(torch.complex128)) is None


def test_without_a_compiler_the_pytorch_path_runs(tmp_path):
    """A fresh process whose compiler does not exist and whose build cache is empty: the kernel is reported
    missing, and the notebook still reads (through its PyTorch blocks)."""
    code = (
        "import logging, torch\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM\n"
        "from modeling_kathleen_notebook.kernels import fourier_kernels\n"
        "assert fourier_kernels() is None\n"
        "model = KathleenForCausalLM(KathleenConfig(d_model=24, hrr_dim=256)).eval()\n"
        "print(model(torch.randint(3, 259, (1, 40))).logits.shape)\n"
    )
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    out = run_fresh_python(code, root, TORCH_EXTENSIONS_DIR=str(tmp_path), CXX=str(tmp_path / "no-compiler"))
    assert "torch.Size([1, 40, 259])" in out


@pytest.mark.parametrize("oracle_gate", [False, True])
@pytest.mark.parametrize("forgetting", [False, True])
def test_compiled_decoding_step_equals_the_pytorch_step(forgetting, oracle_gate, monkeypatch):
    """40 bytes decoded one at a time from an empty state (windows of padding first), B = 2: the compiled
    `notebook_step` and `forward`'s own one-step path give the same reads, memory and tail."""
    from modeling_kathleen_notebook import KathleenConfig
    from modeling_kathleen_notebook.notebook import Notebook

    torch.manual_seed(0)
    notebook = Notebook(KathleenConfig(d_model=24, hrr_dim=256, forgetting=forgetting, forget_logit_init=0.0))
    ids = torch.randint(3, 259, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = (torch.rand(2, 40, generator=torch.Generator().manual_seed(2)) > 0.5).float() if oracle_gate else None

    def decode():
        state, reads = None, []
        with torch.no_grad():
            for t in range(ids.shape[1]):
                read, state = notebook(ids[:, t:t + 1], None, state, None if mask is None else mask[:, t:t + 1])
                reads.append(read)
        return torch.cat(reads, dim=1), state

    compiled, compiled_state = decode()
    monkeypatch.setenv("KATHLEEN_NOTEBOOK_KERNELS", "0")
    pytorch, pytorch_state = decode()
    scale = pytorch.abs().max().item()
    assert scale > 0
    torch.testing.assert_close(compiled, pytorch, rtol=0, atol=1e-5 * scale)
    torch.testing.assert_close(compiled_state.memory, pytorch_state.memory, rtol=0,
                               atol=1e-5 * pytorch_state.memory.abs().max().item())
    assert torch.equal(compiled_state.tail, pytorch_state.tail)


def test_kernels_refuse_indices_outside_their_tables():
    """Ids index the value table inside C++: one out of range is an error that names it, not a stray read."""
    kernels = fourier_kernels()
    values, keys = torch.randn(5, 9, dtype=torch.complex64), torch.randn(1, 3, 9, dtype=torch.complex64)
    frequencies = torch.zeros(9, dtype=torch.long)
    with pytest.raises(RuntimeError, match="value ids outside"):
        kernels.scan_read_bins(values, torch.tensor([[0, 5]]), keys, torch.ones(1, 2), torch.empty(0), frequencies, 16)
    with pytest.raises(RuntimeError, match="frequencies outside"):
        kernels.scan_read_bins(values, torch.tensor([[0, 4]]), keys, torch.ones(1, 2), torch.empty(0),
                               frequencies + 16, 16)
