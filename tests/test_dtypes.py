"""Casting after load: weights may become bf16 / fp16, the notebook's fixed tables and every recurrent state
stay fp32, and the model still runs, generates and trains (issue 20)."""

import dataclasses

import pytest
import torch
from torch import nn

from conftest import tiny_model
from modeling_kathleen_notebook import KathleenConfig
from modeling_kathleen_notebook.configuration_kathleen import KR_NOTEBOOK

VARIANTS = {
    "gate, bundled keys": {},
    "surprise, bound keys": dict(key_binding="bind", write_signal="surprise", forgetting=False),
    "the defaults' notebook (read trust)": {name: getattr(KathleenConfig(), name) for name in KR_NOTEBOOK},
    "attention": dict(memory="attention"),
}
IDS = torch.randint(3, 259, (2, 40), generator=torch.Generator().manual_seed(0))


def state_tensors(cache) -> list[torch.Tensor]:
    parts = [*cache.trunk, cache.memory]
    return [t for part in parts if part is not None
            for t in (dataclasses.astuple(part) if dataclasses.is_dataclass(part) else (part,))
            if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", VARIANTS)
@torch.no_grad()
def test_cast_model_runs_generates_and_keeps_tables_and_state_fp32(variant, dtype):
    model = tiny_model(std=0.3, **VARIANTS[variant])
    tables = {name: buffer.clone() for name, buffer in model.named_buffers()}
    reference = model(IDS).logits
    model.to(dtype)
    out = model(IDS)
    assert out.logits.dtype == dtype
    assert (out.logits.float() - reference).abs().max() < 0.15 * reference.abs().max()  # half precision, not junk
    for name, buffer in model.named_buffers():
        assert buffer.dtype == tables[name].dtype and torch.equal(buffer, tables[name]), name
    for tensor in state_tensors(out.cache):
        assert not tensor.is_floating_point() or tensor.dtype == torch.float32, tensor.dtype
        assert not tensor.is_complex() or tensor.dtype == torch.complex64, tensor.dtype
    generated = model.generate(IDS[:, :5], max_new_tokens=6, do_sample=False, eos_token_id=None)
    assert generated.shape == (2, 11)
    model.half() if dtype == torch.float16 else model.bfloat16()  # the shortcuts take the same path
    assert all(torch.equal(b, tables[n]) for n, b in model.named_buffers())


def test_casting_the_tables_too_is_what_breaks():
    """Control: cast the notebook's tables with the weights (nn.Module's own _apply) and the Fourier value
    table's phases fall off their grid, which the notebook refuses."""
    model = tiny_model(std=0.3)
    nn.Module._apply(model.model.memory, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)
    with pytest.raises(ValueError, match="phases off the grid"):
        model(IDS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_autocast_bf16_training_step(variant):
    model = tiny_model(std=0.3, **VARIANTS[variant]).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(IDS, labels=IDS).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() and g.dtype == torch.float32 for g in grads)


def test_trainer_bf16_trains(tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = tiny_model()
    text = torch.randint(3, 40, (1, 64)).repeat(16, 1)  # one short pattern: learnable in a few steps
    data = Dataset.from_dict({"input_ids": text.tolist(), "labels": text.tolist()})
    args = TrainingArguments(output_dir=str(tmp_path), bf16=True, use_cpu=True, max_steps=12,
                             per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=4, report_to=[],
                             save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses) == 3 and losses[-1] < losses[0], losses


@torch.no_grad()
def test_from_pretrained_in_bf16_keeps_the_tables_fp32(tmp_path):
    from modeling_kathleen_notebook import KathleenForCausalLM

    model = tiny_model(std=0.3)
    model.save_pretrained(tmp_path)
    loaded = KathleenForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert loaded.lm_head.weight.dtype == torch.bfloat16
    assert all(torch.equal(b, dict(model.named_buffers())[n]) for n, b in loaded.named_buffers())
    reference = model(IDS).logits
    assert (loaded(IDS).logits.float() - reference).abs().max() < 0.15 * reference.abs().max()
