"""One decoded byte of a `KathleenForCausalLM` as an ONNX graph that runs without PyTorch (onnxruntime).

    kathleen-notebook export MODEL OUT.onnx        write the graph (its tables in OUT.onnx.data beside it)
    python scripts/onnx_generate.py OUT.onnx --prompt TEXT [--cache FILE]
                                                   decode in onnxruntime without PyTorch, from an empty state or
                                                   from a memory read in PyTorch (a `KathleenCache.save` file)

The graph is the model's step, state in and state out:

    (input_ids [B, 1], trunk.{i}.integrator, trunk.{i}.conv_tail, memory.spectrum, memory.tail, memory.last_logits
     [, memory.repeat_spectrum])
        -> (logits [B, V], the same state names with "next." before them)

with the names, shapes and dtypes of `KathleenCache.to_safetensors` (a complex spectrum as [..., 2] real), so a
cache file is the graph's state. ONNX has no complex tensors, so `ExportableStep` writes the notebook's step
(SPEC §3) in real arithmetic: keys from their integer turns and a table of cos/sin (bound keys) or a sum of the
role ⊛ codebook rows (bundled), the write and read as products of (re, im) pairs, the Fourier read's bins by a
scatter-add and their N-point FFT as a product with a [N, V] cos/sin table. A repeat bank is the same write and
read with keys over the newest repeat_key_window bytes, its read added before the trust (or passed through its own
trust with config.repeat_read_trust: `Notebook.combine`). Its oracle is the model's
own step: the tests run 200 steps of both and of the exported graph (fp32, 1e-4).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from .codebooks import KEY_TURNS, roots_of_unity
from .configuration_kathleen import PAD_ID
from .modeling_kathleen import KathleenForCausalLM
from .notebook import Notebook
from .read_out import FourierReadOut

OPSET = 18


def complex_product(a: torch.Tensor, b: torch.Tensor, conjugate_b: bool = False) -> torch.Tensor:
    """a ⊙ b (or a ⊙ conj(b)) for complex numbers stored as [..., 2] (re, im)."""
    ar, ai, br, bi = a[..., 0], a[..., 1], b[..., 0], b[..., 1]
    if conjugate_b:
        return torch.stack([ar * br + ai * bi, ai * br - ar * bi], dim=-1)
    return torch.stack([ar * br - ai * bi, ar * bi + ai * br], dim=-1)


class ExportableStep(nn.Module):
    """`KathleenForCausalLM`'s one-byte step without complex tensors or data-dependent control flow."""

    def __init__(self, model: KathleenForCausalLM):
        super().__init__()
        config = model.config
        if config.memory not in ("notebook", "none"):
            raise ValueError(f"only notebook models and bare trunks export; this one has memory={config.memory!r}")
        if config.memory == "notebook" and config.fact_bank:
            raise ValueError("the exported step does not hold a fact bank (config.fact_bank)")
        self.trunk, self.lm_head = model.model.trunk, model.lm_head
        self.n_layers = config.n_layers
        self.notebook: Notebook | None = model.model.memory if config.memory == "notebook" else None
        if self.notebook is not None:
            self.setup_notebook(self.notebook)

    def setup_notebook(self, notebook: Notebook) -> None:
        """The fixed tables of the step, in real numbers."""
        settings, tables = notebook.config, notebook.tables()
        self.settings, self.tail_length = settings, notebook.tail_length
        reader = tables.reader
        self.fourier = isinstance(reader, FourierReadOut)
        if tables.bound:  # key turns Σ_j k_j x_{t-j} mod Q, exact in float64; cos/sin of the Q turns
            self.register_buffer("key_frequencies", tables.key_rows, persistent=False)
            if settings.repeat_key_window:
                self.register_buffer("repeat_key_frequencies", notebook.repeat_tables().key_rows, persistent=False)
            self.register_buffer("roots", torch.view_as_real(roots_of_unity(KEY_TURNS)), persistent=False)
            # CV[x]_f = exp(2πi k_f x / N) from the N roots of unity: no [V, F] table in the graph at a large R
            scale = tables.write_values[0, 0].real  # the binding scale (row 0 of the values is all ones)
            self.register_buffer("value_frequencies", tables.reader.frequencies, persistent=False)
            self.register_buffer("value_roots", torch.view_as_real(roots_of_unity(reader.period)) * scale,
                                 persistent=False)
        else:  # bundled keys: the sum of W rows of the role ⊛ codebook spectra, and the value spectra
            self.register_buffer("key_rows", tables.key_rows.view(tables.key_rows.shape[0], -1, 2), persistent=False)
            self.register_buffer("row_offsets", tables.row_offsets, persistent=False)
            self.register_buffer("write_values", torch.view_as_real(tables.write_values), persistent=False)
        if self.fourier:  # bins H_k = Σ_{f: k_f = k} (halved at DC and Nyquist) u_f; read_b = gain Re FFT_N(H)_b
            half = torch.ones(tables.write_values.shape[1])
            half[[0, -1]] = 0.5
            bins, values = torch.arange(reader.period, dtype=torch.float64), torch.arange(reader.vocab)
            angle = 2 * math.pi * bins[:, None] * values / reader.period
            self.register_buffer("bin_index", reader.frequencies, persistent=False)
            self.register_buffer("bin_weight", half, persistent=False)
            self.register_buffer("dft", torch.stack([angle.cos(), angle.sin()]).float() * reader.gain, persistent=False)
            self.period = reader.period
        else:
            self.register_buffer("read_table", reader.table, persistent=False)

    # ---- the notebook's step in real arithmetic ------------------------------------------------------------

    def keys(self, windows: torch.Tensor, frequencies: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Unnormalised key spectra [B, n, F, 2] and their scales 1/‖k‖ [B, n] of windows [B, n, W] (newest last);
        bound keys by `frequencies` [W, F] (default: the first memory's)."""
        present = (windows != PAD_ID).any(-1).float()  # a window of padding: the zero key
        if hasattr(self, "roots"):
            frequencies = self.key_frequencies if frequencies is None else frequencies
            turns = torch.remainder(windows.double() @ frequencies, KEY_TURNS).long()
            return self.roots[turns], present  # unit modulus: ‖k‖ = 1
        key = self.key_rows[windows + self.row_offsets].sum(dim=-3)  # [B, n, F, 2]
        R = self.settings.hrr_dim  # R ‖k‖² = Σ_f m_f |K_f|², m = 2 but 1 at DC and Nyquist (real there)
        squared = 2 * key.square().sum((-2, -1)) - key[..., 0, 0].square() - key[..., -1, 0].square()
        scales = torch.where(squared > 0, (R / squared.clamp_min(1e-30)).sqrt(), torch.zeros_like(squared))
        return key, scales

    def values_of(self, ids: torch.Tensor) -> torch.Tensor:
        """CV[x] [B, F, 2] for ids [B], as a write binds them."""
        if hasattr(self, "value_roots"):
            return self.value_roots[torch.remainder(ids[:, None] * self.value_frequencies, self.period)]
        return self.write_values[ids]

    def read(self, unbound: torch.Tensor) -> torch.Tensor:
        """⟨u, cv_b⟩ for every b of unbound spectra [B, F, 2] -> [B, V]."""
        if not self.fourier:
            return unbound.flatten(-2) @ self.read_table
        weighted = unbound * self.bin_weight[:, None]
        index = self.bin_index[None, :, None].expand(unbound.shape[0], -1, 2)
        bins = torch.zeros(unbound.shape[0], self.period, 2, dtype=unbound.dtype).scatter_add(1, index, weighted)
        return bins[..., 0] @ self.dft[0] + bins[..., 1] @ self.dft[1]

    def write_strength(self, ids_with_tail: torch.Tensor, last_logits: torch.Tensor) -> torch.Tensor:
        """β [B] of the new byte: the gate's logit and/or a · (S - c) of the trunk's surprise S at it."""
        notebook, settings = self.notebook, self.settings
        logit = torch.zeros(ids_with_tail.shape[0])
        if notebook.gate is not None:  # one window: the gate's own one-step path
            logit = logit + notebook.gate(ids_with_tail[:, -settings.gate_window:])[:, 0]
        if settings.uses_surprise:
            byte = ids_with_tail[:, -1:]
            surprise = torch.logsumexp(last_logits, -1) - last_logits.gather(1, byte)[:, 0]
            logit = logit + notebook.surprise_scale * (surprise - notebook.surprise_shift)
        return torch.sigmoid(logit)

    def notebook_step(
        self, ids: torch.Tensor, spectra: list[torch.Tensor], tail: torch.Tensor, last_logits: torch.Tensor,
        trunk_logits: torch.Tensor,
    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """The memory's logit bias [B, V] for the byte after ids [B, 1], the new spectra (the first memory's, then a
        repeat bank's) and tail."""
        notebook, settings = self.notebook, self.settings
        ids_with_tail = torch.cat([tail, ids], dim=1)
        beta = self.write_strength(ids_with_tail, last_logits)
        keep = notebook.keep_factors(beta) if settings.forgetting else torch.ones_like(beta)
        value = self.values_of(ids[:, 0])
        banks = [(settings.key_window, None, notebook.read_scale)]
        if settings.repeat_key_window:
            banks.append((settings.repeat_key_window, self.repeat_key_frequencies, notebook.repeat_read_scale))
        reads, written = [], []
        for spectrum, (window, frequencies, read_scale) in zip(spectra, banks):
            keys, scales = self.keys(ids_with_tail[:, -(window + 1):].unfold(1, window, 1), frequencies)  # t-1, t
            spectrum = keep[:, None, None] * spectrum + (beta * scales[:, 0])[:, None, None] * complex_product(
                value, keys[:, 0])
            read = self.read(complex_product(spectrum, keys[:, 1], conjugate_b=True))
            reads.append(read * (scales[:, 1] * read_scale)[:, None])
            written.append(spectrum)
        return notebook.trusted(notebook.combine(reads), trunk_logits), written, ids_with_tail[:, -self.tail_length:]

    # ---- the model's step ---------------------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """input_ids [B, 1] and the state in `state_names` order -> logits [B, V] and the new state."""
        from .trunk import TrunkState

        h = self.trunk.embed(input_ids)
        trunk_state = []
        for i, block in enumerate(self.trunk.blocks):
            h, block_state = block.step(h, TrunkState(state[2 * i], state[2 * i + 1]))
            trunk_state += [block_state.integrator, block_state.conv_tail]
        logits = self.lm_head(self.trunk.final_norm(h))[:, 0]
        if self.notebook is None:
            return (logits, *trunk_state)
        spectrum, tail, last_logits, *banks = state[2 * self.n_layers:]  # banks: a repeat bank's spectrum
        memory_logits, spectra, tail = self.notebook_step(input_ids, [spectrum, *banks], tail, last_logits, logits)
        next_last = logits if self.settings.uses_surprise else last_logits
        return (logits + memory_logits, *trunk_state, spectra[0], tail, next_last, *spectra[1:])


def state_names(config) -> list[str]:
    """The graph's state inputs: `KathleenCache.to_safetensors`' tensor names, in order."""
    names = [f"trunk.{i}.{field}" for i in range(config.n_layers) for field in ("integrator", "conv_tail")]
    if config.memory != "notebook":
        return names
    return names + ["memory.spectrum", "memory.tail", "memory.last_logits"] + (
        ["memory.repeat_spectrum"] if config.repeat_key_window else [])


def empty_state(config, batch_size: int) -> dict[str, torch.Tensor]:
    """The state before anything was read, as the graph takes it (and `KathleenCache.to_safetensors` writes it)."""
    B, D = batch_size, config.d_model
    state = {}
    for i in range(config.n_layers):
        state[f"trunk.{i}.integrator"] = torch.zeros(B, D)
        state[f"trunk.{i}.conv_tail"] = torch.zeros(B, config.conv_kernel - 1, D)
    if config.memory == "notebook":
        state["memory.spectrum"] = torch.zeros(B, config.hrr_dim // 2 + 1, 2)
        state["memory.tail"] = torch.full((B, config.tail_length), PAD_ID)
        state["memory.last_logits"] = torch.zeros(B, config.vocab_size if config.uses_surprise else 0)
        if config.repeat_key_window:
            state["memory.repeat_spectrum"] = torch.zeros_like(state["memory.spectrum"])
    return state


def export_step(model: KathleenForCausalLM, path: str | Path) -> Path:
    """Write the one-byte step of `model` (eval mode, fp32) as an ONNX graph with a dynamic batch size."""
    step = ExportableStep(model.float().eval())
    example = empty_state(model.config, 2)
    names = state_names(model.config)
    inputs = (torch.full((2, 1), 3 + ord("a")), *(example[name] for name in names))
    batch = torch.export.Dim("batch")
    shapes = ({0: batch}, tuple({0: batch} for _ in names))  # forward(input_ids, *state)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        program = torch.onnx.export(step, inputs, input_names=["input_ids", *names],
                                    output_names=["logits", *(f"next.{n}" for n in names)], dynamic_shapes=shapes,
                                    opset_version=OPSET, dynamo=True, external_data=True)
    program.save(str(path))
    return path
