"""The notebook (SPEC §3): fast path = streaming = sequential reference; recall; exact unlearning."""

import dataclasses
import importlib.util
import pathlib
import random

import pytest
import torch

from conftest import reference_config, run_form, stream_through, tiny_config
from modeling_kathleen_notebook import KathleenConfig
from modeling_kathleen_notebook.codebooks import NotebookTables, make_tables, parseval_weights, read_table
from modeling_kathleen_notebook.configuration_kathleen import PAD_ID
from modeling_kathleen_notebook.experiments.needle import make_needle_example
from modeling_kathleen_notebook.notebook import Notebook
from modeling_kathleen_notebook.read_out import TableReadOut
from modeling_kathleen_notebook.record import contribution, scan, trace
from modeling_kathleen_notebook.scan_read import scan_and_read_chunked, scan_and_read_reference

NUMPY_ORACLE = pathlib.Path(__file__).resolve().parents[2] / "shared" / "reference" / "notebook_numpy.py"


def read(notebook: Notebook, memory: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """(4)-(5) without the read scale: ⟨memory ⊛† key_t, cv_b⟩ for every b. [B, T, F] x2 -> [B, T, V]."""
    return notebook.tables().reader(memory * keys.conj())


def tiny_notebook(seed=0, **overrides) -> Notebook:
    torch.manual_seed(seed)
    notebook = Notebook(tiny_config(**overrides)).eval()
    with torch.no_grad():  # a gate that writes some bytes and not others
        notebook.gate.out.bias.fill_(0.0)
        notebook.gate.out.weight.normal_(0.0, 3.0)
        notebook.forget_logit.fill_(1.0)  # g ≈ 0.15: forgetting that matters
    return notebook


@pytest.mark.parametrize("forgetting", [False, True])
@pytest.mark.parametrize("T", [1, 7, 257, 513, 3000])
def test_streaming_equals_parallel(T, forgetting, device):
    notebook = tiny_notebook(forgetting=forgetting).to(device)
    ids = torch.randint(3, 259, (2, T)).to(device)
    valid = torch.ones(2, T, dtype=torch.bool, device=device)
    with torch.no_grad():
        full, full_state = notebook(ids, valid)
        one_by_one, state = stream_through(notebook, ids, valid, 1)
        pieces, _ = stream_through(notebook, ids, valid, 45)  # pieces that straddle the 32-position scan chunks
    assert T == 1 or full.abs().max() > 1e-3  # the memory says something (nothing is written at t = 0)
    torch.testing.assert_close(one_by_one, full, rtol=0, atol=1e-4)
    torch.testing.assert_close(pieces, full, rtol=0, atol=1e-4)
    torch.testing.assert_close(state.spectrum, full_state.spectrum, rtol=1e-4, atol=1e-4)
    assert torch.equal(state.tail, full_state.tail)


@pytest.mark.parametrize("fft_norm", ["backward", "ortho"])
@pytest.mark.parametrize("value_codebook", ["shared", "gaussian", "fourier"])
@pytest.mark.parametrize("forgetting", [False, True])
def test_parallel_equals_sequential_reference(fft_norm, value_codebook, forgetting, device):
    notebook = tiny_notebook(fft_norm=fft_norm, value_codebook=value_codebook, forgetting=forgetting,
                             scan_chunk=16).to(device)
    ids = torch.randint(0, 259, (3, 70)).to(device)  # pad (0), eos and unk ids among the bytes
    valid = (torch.rand(3, 70) > 0.15).to(device)
    ids = torch.where(valid, ids, 0)
    with torch.no_grad():
        first, state = notebook(ids[:, :40], valid[:, :40])
        first_ref, state_ref = run_form(scan_and_read_reference, notebook, ids[:, :40], valid[:, :40])
        second, final = notebook(ids[:, 40:], valid[:, 40:], state)
        second_ref, final_ref = run_form(scan_and_read_reference, notebook, ids[:, 40:], valid[:, 40:], state_ref)
    scale = first_ref.abs().max()
    torch.testing.assert_close(first / scale, (first_ref / scale).float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(second / scale, (second_ref / scale).float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(final.spectrum, final_ref.spectrum.to(final.spectrum.dtype), rtol=1e-4, atol=1e-4)
    assert torch.equal(final.tail, final_ref.tail)


def test_gradients_reach_gate_scale_and_forget_rate_only():
    notebook = tiny_notebook()
    notebook.train()
    logits, _ = notebook(torch.randint(3, 259, (2, 50)), torch.ones(2, 50, dtype=torch.bool))
    logits.square().mean().backward()
    for name, param in notebook.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    assert {name for name, _ in notebook.named_buffers()} == {"key_codebook", "value_codebook", "roles"}


def test_codebooks_roles_unitary_keys_unit_norm():
    notebook = Notebook(reference_config())
    spectra = torch.fft.rfft(notebook.roles.double())
    torch.testing.assert_close(spectra.abs(), torch.ones_like(spectra.abs()), rtol=0, atol=1e-5)
    torch.testing.assert_close(notebook.key_codebook.norm(dim=1), torch.ones(259), rtol=0, atol=1e-5)
    ids = torch.randint(0, 259, (2, 40))
    keys = notebook.tables().bind(torch.cat([torch.zeros(2, notebook.tail_length, dtype=torch.long), ids], 1),
                                  40).normalised_keys()
    norms = torch.fft.irfft(keys, n=2048).norm(dim=-1)
    nonzero = norms > 0  # a window of padding only is the zero key
    torch.testing.assert_close(norms[nonzero], torch.ones_like(norms[nonzero]), rtol=0, atol=1e-5)
    assert nonzero.sum() >= 70


def test_delta_rule_erase_equals_global_decay_with_unitary_key():
    """mem - gβ k ⊛ (mem ⊛† k) = (1 - gβ) mem when |rfft(k)| = 1 (SPEC §3)."""
    notebook = Notebook(reference_config())
    key, mem = notebook.roles[0].double(), torch.randn(2048, dtype=torch.float64)
    unbound = torch.fft.irfft(torch.fft.rfft(mem) * torch.fft.rfft(key).conj(), n=2048)
    rebound = torch.fft.irfft(torch.fft.rfft(key) * torch.fft.rfft(unbound), n=2048)
    g_beta = 0.13
    torch.testing.assert_close(mem - g_beta * rebound, (1 - g_beta) * mem, rtol=0, atol=1e-5)
    gaussian = notebook.key_codebook[5].double()  # the negative control: a non-unitary key does not decay evenly
    unbound = torch.fft.irfft(torch.fft.rfft(mem) * torch.fft.rfft(gaussian).conj(), n=2048)
    rebound = torch.fft.irfft(torch.fft.rfft(gaussian) * torch.fft.rfft(unbound), n=2048)
    assert (mem - g_beta * rebound - (1 - g_beta) * mem).abs().max() > 1e-2


def trainable_count(module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def test_parameter_counts():
    """[KR]'s notebook: its gate's 24.7K parameters; the default one (surprise writes, forgetting, a read trust): a, c,
    the read scale, the forget logit (unless held) and the trust's 8; without forgetting and trust a, c and the read
    scale. The attention arm is sized to [KR]'s notebook whatever the write rule."""
    assert trainable_count(Notebook(reference_config(vocab_size=256))) == 24_643
    assert trainable_count(Notebook(reference_config())) == 24_739 == reference_config().notebook_parameter_count
    assert trainable_count(Notebook(KathleenConfig())) == 12 == KathleenConfig().notebook_parameter_count
    without = KathleenConfig(read_trust=False, forgetting=False)
    assert trainable_count(Notebook(without)) == 3 == without.notebook_parameter_count
    assert trainable_count(Notebook(KathleenConfig(read_trust=False))) == 4
    held = KathleenConfig(learn_forget_rate=False)
    assert trainable_count(Notebook(held)) == 11 == held.notebook_parameter_count
    assert KathleenConfig(memory="attention").effective_attention_dim == reference_config().effective_attention_dim > 30


def parseval_check():
    x, y = torch.randn(2, 64, dtype=torch.float64)
    X, Y = torch.fft.rfft(x), torch.fft.rfft(y)
    return (parseval_weights(64, x.device) * (X * Y.conj()).real).sum() / 64, x @ y


def test_parseval_read_identity():
    fast, direct = parseval_check()
    torch.testing.assert_close(fast, direct)


# ---- recall of the untrained memory path (full size, oracle write mask) --------------------------


def memory_recall(notebook, length, n_needles, write_everything, trials, seed):
    rng, accuracies = random.Random(seed), []
    for _ in range(trials):
        example = make_needle_example(length, rng, n_needles=n_needles)
        mask = torch.ones(length) if write_everything else example.write_mask()
        with torch.no_grad():
            logits, _ = notebook(example.input_ids[None], torch.ones(1, length, dtype=torch.bool),
                                 write_mask=mask[None])
        accuracies.append(example.value_accuracy(logits[0]))
    return sum(accuracies) / trials


@pytest.fixture(scope="module")
def full_notebook():
    return Notebook(reference_config(forgetting=False)).eval()


def test_untrained_recall_is_length_flat(full_notebook):
    one = [memory_recall(full_notebook, L, 1, False, 16, seed=L) for L in (512, 2048, 4096)]
    five = [memory_recall(full_notebook, L, 5, False, 16, seed=L + 1) for L in (512, 2048, 4096)]
    assert min(one) >= 0.95, one
    assert min(five) >= 0.80, five
    assert max(five) - min(five) <= 0.08 and max(one) - min(one) <= 0.08, (one, five)


def test_writing_everything_recalls_nothing(full_notebook):
    """The negative control: β = 1 on every byte floods the memory (n ≫ R / 20)."""
    for L in (512, 2048, 4096):
        assert memory_recall(full_notebook, L, 1, True, 16, seed=L + 2) <= 0.10, L


# ---- exact unlearning and attribution by linearity ----------------------------------------------


@pytest.mark.parametrize("length", [512, 2048])
def test_unlearning_and_attribution(length):
    notebook = Notebook(reference_config(forgetting=False)).eval()
    rng = random.Random(length)
    erased, retained, provenance = [], [], []
    for _ in range(8):
        example = make_needle_example(length, rng, n_needles=5)
        ids, valid = example.input_ids[None], torch.ones(1, length, dtype=torch.bool)
        with torch.no_grad():
            traced, _ = trace(notebook, ids, valid, write_mask=example.write_mask()[None])
            _, memory = scan(notebook, traced, output_final_state=True)  # [1, F] after all writes
            facts = []
            for start, end in example.needle_spans:
                span = torch.zeros(1, length)
                span[0, start:end] = 1.0
                facts.append(contribution(notebook, traced, span, output_final_state=True)[1])
            victim = rng.randrange(5)
            for f, (start, _) in enumerate(example.needle_spans):
                positions = slice(start + 6, start + 12)  # reads after "<MARK>key", ... predict the value
                targets = ids[0, start + 7:start + 13]
                keys = traced.keys[:, positions]
                after = read(notebook, (memory - facts[victim]).unsqueeze(1), keys)[0].argmax(-1)
                (erased if f == victim else retained).append((after == targets).float().mean().item())
                before = read(notebook, memory.unsqueeze(1), keys)[0].argmax(-1)
                for i in torch.nonzero(before == targets).flatten().tolist():
                    drops = [read(notebook, c.unsqueeze(1), keys[:, i:i + 1])[0, 0, before[i]] for c in facts]
                    provenance.append(int(torch.stack(drops).argmax()) == f)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(erased) <= 0.15, mean(erased)
    assert mean(retained) >= 0.75, mean(retained)
    assert mean(provenance) >= 0.98, mean(provenance)


@pytest.mark.parametrize("forgetting", [False, True])
def test_contribution_is_exact(forgetting):
    """Memory minus a span's contribution = the memory built with that span's writes left out."""
    notebook = tiny_notebook(forgetting=forgetting)
    ids = torch.randint(3, 259, (2, 300))
    with torch.no_grad():
        traced, _ = trace(notebook, ids, torch.ones(2, 300, dtype=torch.bool))
        span = torch.zeros(2, 300)
        span[:, 100:140] = 1.0
        _, full = scan(notebook, traced, output_final_state=True)
        _, part = contribution(notebook, traced, span, output_final_state=True)
        without = dataclasses.replace(traced, writes=traced.writes * (1 - span).unsqueeze(-1))
        _, expected = scan(notebook, without, output_final_state=True)
        # and the explicit product formula of SPEC §3
        later_keep = torch.flip(torch.cumprod(torch.flip(traced.keep, [1]), 1), [1])  # Π_{v ≥ u} a_v
        later_keep = torch.cat([later_keep[:, 1:], torch.ones(2, 1)], 1)  # Π_{v > u} a_v
        formula = (later_keep * traced.beta * span).unsqueeze(-1).mul(traced.writes).sum(1)
    relative = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731
    assert relative(full - part, expected) <= 1e-5
    assert relative(part, formula) <= 1e-5


# ---- a second opinion: the independent NumPy model of SPEC §3 -------------------------------------


@pytest.mark.skipif(not NUMPY_ORACLE.exists(), reason="../shared/reference/notebook_numpy.py not present")
def test_reference_agrees_with_numpy_oracle():
    spec = importlib.util.spec_from_file_location("notebook_numpy", NUMPY_ORACLE)
    oracle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oracle)
    import numpy as np

    notebook = Notebook(reference_config(value_codebook="shared", forgetting=False))
    ck = notebook.key_codebook[3:].double().numpy()  # rows of the 256 byte ids
    oracle.CK, oracle.ROLES = ck, notebook.roles.double().numpy()
    oracle.CKf, oracle.ROLf = np.fft.rfft(ck, axis=1), np.fft.rfft(oracle.ROLES, axis=1)
    data = np.frombuffer(b"the cat sat on the mat; the cat sat on the hat", np.uint8).astype(np.int64)
    beta = np.linspace(0.2, 1.0, len(data))
    expected = oracle.notebook_logits(data, beta)  # [T, 256] = ck @ r_t
    ids = torch.from_numpy(data + 3)[None]
    tail = torch.full((1, notebook.tail_length), PAD_ID)
    ours, _ = scan_and_read_reference(notebook.tables(), torch.cat([tail, ids], 1), torch.from_numpy(beta)[None], None)
    np.testing.assert_allclose(ours[0, :, 3:].numpy(), expected, atol=1e-6)
    with torch.no_grad():
        fast, _ = notebook(ids, torch.ones_like(ids, dtype=torch.bool), write_mask=torch.from_numpy(beta)[None])
    np.testing.assert_allclose(fast[0, :, 3:].numpy() / notebook.read_scale.item(), expected, atol=1e-4)


def random_read_outs(g: torch.Generator, Fq: int, V: int) -> dict:
    """Both read-outs on random tables: a Parseval table, and Fourier bins of period 16 > V = 11."""
    from modeling_kathleen_notebook.read_out import FourierReadOut, TableReadOut

    return {"table": TableReadOut(torch.randn(2 * Fq, V, generator=g, dtype=torch.float64)),
            "fourier": FourierReadOut(torch.randint(0, 16, (Fq,), generator=g), 16, V, gain=0.3)}


@pytest.mark.parametrize("kernels", ["1", "0"])
@pytest.mark.parametrize("forgetting", [False, True])
def test_fused_scan_and_read_in_fp32_matches_the_fp64_reference(forgetting, kernels, monkeypatch):
    """The model's own precision (complex64, where the read-out takes its fastest paths, the compiled kernel
    or the PyTorch blocks): reads and the gradients of β, keep and the read weights close to the fp64 loop
    reference."""
    monkeypatch.setenv("KATHLEEN_NOTEBOOK_KERNELS", kernels)

    notebook = Notebook(reference_config(forgetting=forgetting))
    ids = torch.randint(3, 259, (2, 300), generator=torch.Generator().manual_seed(0))
    ids_with_tail = notebook.with_tail(ids, None)
    g = torch.Generator().manual_seed(1)
    beta = torch.rand(2, 300, generator=g)
    keep = 0.8 + 0.2 * torch.rand(2, 300, generator=g) if forgetting else None
    rho = torch.rand(2, 300, generator=g) + 0.5
    weights = torch.randn(2, 300, 259, generator=g)
    results = []
    for form in (scan_and_read_chunked, scan_and_read_reference):
        inputs = [x.clone().requires_grad_() for x in (beta, rho) + (() if keep is None else (keep,))]
        b, r, k = inputs[0], inputs[1], (inputs[2] if keep is not None else None)
        reads, _ = form(notebook.tables(), ids_with_tail, b, k, None, r)
        grads = torch.autograd.grad((reads * weights.to(reads.dtype)).sum(), inputs)
        results.append((reads.double(), [x.double() for x in grads]))
    (fast, fast_grads), (ref, ref_grads) = results
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-4)
    for a, b in zip(fast_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-2 * b.abs().max().item())


def test_pick_columns_equals_index_select():
    from modeling_kathleen_notebook.read_out import pick_columns

    x = torch.randn(3, 5, 17, dtype=torch.complex64)
    x[0, 0, 0] = complex(float("nan"), float("-inf"))  # bits are copied, not computed on
    index = torch.randint(0, 17, (40,))
    assert torch.equal(pick_columns(x, index).view(torch.int64), x.index_select(-1, index).view(torch.int64))
    wide = torch.randn(3, 5, 17, dtype=torch.complex128)  # other dtypes: index_select itself
    assert torch.equal(pick_columns(wide, index), wide.index_select(-1, index))


@pytest.mark.parametrize("read_out", ["table", "fourier"])
def test_read_out_adjoint_is_its_vector_jacobian_product(read_out):
    g = torch.Generator().manual_seed(0)
    reader = random_read_outs(g, 33, 11)[read_out]
    unbound = torch.randn(4, 33, generator=g, dtype=torch.complex128).requires_grad_()
    grad = torch.randn(4, 11, generator=g, dtype=torch.float64)
    (expected,) = torch.autograd.grad((reader(unbound) * grad).sum(), unbound)
    torch.testing.assert_close(reader.adjoint(grad), expected, rtol=1e-10, atol=1e-10)


def tables_in_float64(notebook: Notebook) -> NotebookTables:
    """The notebook's tables made from its codebooks in float64: the chunked form then runs in the reference's
    precision."""
    return make_tables({name: table.double() for name, table in notebook.named_buffers()}, notebook.config)


@pytest.mark.parametrize("whole_batch", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("read_from", [0.0, 0.5])
@pytest.mark.parametrize("value_codebook", ["gaussian", "fourier"])
@pytest.mark.parametrize("forgetting", [False, True])
@pytest.mark.parametrize("T", [2, 7, 300])
def test_chunked_scan_and_read_equals_reference_with_gradients(T, forgetting, value_codebook, read_from, weighted,
                                                               whole_batch, monkeypatch, device):
    """The chunked, blocked scan + read and its hand-written backward against the loop in time and autograd
    through it, both in float64: reads, end memory, and the gradients of β, keep, the initial memory and the read
    weights. Blocks of 16 positions and chunks of 64, so that block and chunk carries both run; with read_from, only
    the second half is read (the chunks before it only advance the memory); whole_batch runs the blocks an
    accelerator would (all sequences at once) on the CPU. Padding (pad ids) in the bytes: windows of padding only."""
    from modeling_kathleen_notebook import scan_read_chunk

    first_read = int(read_from * T)
    monkeypatch.setattr(scan_read_chunk, "BLOCK", 16)
    if whole_batch:
        monkeypatch.setattr(scan_read_chunk, "row_groups", lambda batch, device: [slice(0, batch)])
    notebook = Notebook(tiny_config(hrr_dim=64, value_codebook=value_codebook, forgetting=forgetting,
                                    scan_chunk=64)).to(device)
    g = torch.Generator().manual_seed(T)
    B = 2

    def drawn(tensor: torch.Tensor) -> torch.Tensor:  # drawn on the CPU (the same numbers everywhere), then moved
        return tensor.to(device).requires_grad_(tensor.is_floating_point() or tensor.is_complex())

    ids = drawn(torch.randint(0, 259, (B, notebook.tail_length + T), generator=g))
    ids[0, :notebook.tail_length + 2] = PAD_ID  # keys of padding only
    beta = drawn(torch.rand(B, T, generator=g, dtype=torch.float64))
    keep = drawn(0.8 + 0.2 * torch.rand(B, T, generator=g, dtype=torch.float64)) if forgetting else None
    # a memory is the spectrum of a real vector: DC and Nyquist are real
    memory = drawn(torch.fft.rfft(torch.randn(B, 64, generator=g, dtype=torch.float64)))
    rho = drawn(torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) if weighted else None
    fast, fast_final = scan_and_read_chunked(tables_in_float64(notebook), ids, beta, keep, memory, rho, first_read)
    ref, ref_final = scan_and_read_reference(notebook.tables(), ids, beta, keep, memory, rho, first_read)
    assert ref.abs().max() > 1e-3
    # the Fourier read assumes rows of exactly exp(2πi k_f b / N); the stored fp32 codebook is that to ~1e-7
    tol = 1e-9 if value_codebook == "gaussian" else 1e-6
    torch.testing.assert_close(fast, ref, rtol=tol, atol=tol)
    torch.testing.assert_close(fast_final, ref_final, rtol=tol, atol=tol)
    weights = torch.randn(B, T - first_read, 259, generator=g, dtype=torch.float64).to(device)
    final_weights = torch.fft.rfft(torch.randn(B, 64, generator=g, dtype=torch.float64)).to(device)
    inputs = (beta, memory) + (() if keep is None else (keep,)) + (() if rho is None else (rho,))

    def loss(reads, final):
        return (reads * weights).sum() + (final * final_weights).real.sum()

    fast_grads = torch.autograd.grad(loss(fast, fast_final), inputs)
    ref_grads = torch.autograd.grad(loss(ref, ref_final), inputs)
    for a, b in zip(fast_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=10 * tol, atol=10 * tol * b.abs().max().item())


@pytest.mark.parametrize("period", [None, 259, 300])
def test_fourier_read_equals_table_read(period, device):
    """The scatter + N-point FFT read equals the [2F, V] Parseval product, for the default period (288), the
    vocabulary size (checkpoints before fourier_period) and any other N ≥ V."""
    notebook = Notebook(reference_config(value_codebook="fourier", fourier_period=period)).to(device)
    unbound = torch.randn(3, 5, 1025, dtype=torch.complex64, device=device)
    tables = notebook.tables()
    table = TableReadOut(read_table(tables.write_values, 2048))
    torch.testing.assert_close(tables.reader(unbound), table(unbound), rtol=0, atol=1e-4)


def test_fourier_value_rows_are_nearly_orthogonal_for_any_period():
    """⟨cv_a, cv_b⟩ ≈ 0 for a ≠ b (|·| ≲ 4/sqrt(F)) and 1 on the diagonal, whatever the period N ≥ V."""
    for period in (259, 288, 512):
        values = Notebook(reference_config(fourier_period=period)).value_codebook.double()
        gram = values @ values.T
        torch.testing.assert_close(gram.diagonal(), torch.ones(259, dtype=torch.float64), rtol=0, atol=1e-5)
        off = gram - torch.diag(gram.diagonal())
        assert off.abs().max() < 4 / 1025**0.5, period


def test_value_table_with_another_period_is_refused():
    """A stored table built with one period and a config that names another: a named error, not wrong reads."""
    notebook = Notebook(reference_config(fourier_period=259))
    notebook.value_codebook.copy_(Notebook(reference_config(fourier_period=288)).value_codebook)
    with pytest.raises(ValueError, match="fourier_period=259"):
        notebook.tables()


def test_gate_and_keys_see_only_their_windows():
    """β_t depends on bytes t-15..t only and key_t on bytes t-6..t only: nothing global (SPEC §3)."""
    notebook = tiny_notebook()
    ids = torch.randint(3, 259, (1, 60))
    changed = ids.clone()
    changed[0, 20] = (ids[0, 20] - 3 + 1) % 256 + 3  # one byte differs, at position 20
    valid = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        a, _ = trace(notebook, ids, valid)
        b, _ = trace(notebook, changed, valid)
    beta_differs = (a.beta != b.beta)[0].nonzero().flatten().tolist()
    key_differs = ((a.keys - b.keys).abs().amax(-1) > 0)[0].nonzero().flatten().tolist()
    assert set(beta_differs) <= set(range(20, 36)) and 20 in beta_differs
    assert key_differs == list(range(20, 27))


@pytest.mark.parametrize("length", [1, 5, 300])
def test_gate_equals_its_convolution_with_gradients(length, device):
    """The gate's tap-table sum (and its one-step product) equals nn.Conv1d over the embedded window, values
    and gradients, padding included; the embedding's padding row gets no gradient either way."""
    gate = tiny_notebook().gate.double().to(device)
    with torch.no_grad():
        gate.embed.weight[PAD_ID].normal_()  # a nonzero padding row must still be read, and not trained
    ids = torch.randint(3, 259, (3, gate.window - 1 + length), device=device)
    ids[0, :gate.window + 2] = PAD_ID
    grads = []
    for run in (gate, gate.forward_reference):
        gate.zero_grad()
        logits = run(ids)
        (logits * torch.linspace(-1, 1, logits.numel(), dtype=torch.float64, device=device).view_as(logits)).sum(
        ).backward()
        grads.append((logits.detach(), *(p.grad.clone() for p in gate.parameters())))
    for fast, reference in zip(*grads):
        torch.testing.assert_close(fast, reference, rtol=1e-10, atol=1e-12)
    assert gate.embed.weight.grad[PAD_ID].abs().max() == 0
