"""The read trust (read_trust.py) and scripts/fit_read_trust.py: a checkpoint without a trust gets one
initialised, the fit lowers the cross-entropy it is fitted on and is saved with the checkpoint."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from modeling_kathleen_notebook import KathleenConfig, KathleenForCausalLM
from modeling_kathleen_notebook.read_trust import INITIAL_BIAS, INITIAL_THRESHOLD, initial_weights

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the of a river stone house north king music early found large village second written".split()


def test_a_checkpoint_without_a_trust_gets_one_initialised(tmp_path):
    tiny_model(std=0.3, key_binding="bind", write_signal="surprise").save_pretrained(tmp_path)
    plain = KathleenForCausalLM.from_pretrained(tmp_path)
    trusted = KathleenForCausalLM.from_pretrained(tmp_path, read_trust=True)
    assert plain.model.memory.trust is None  # control: only asked for, a trust appears
    assert trusted.model.memory.trust.weights.tolist() == initial_weights(INITIAL_BIAS).tolist()
    assert trusted.model.memory.trust.threshold.item() == INITIAL_THRESHOLD


def test_the_trust_starts_at_the_configured_bias(tmp_path):
    """read_trust_bias_init sets θ₀ of a new trust, built or initialised alone in a checkpoint without one; the
    other weights start at zero."""
    loud = tiny_model(key_binding="bind", write_signal="surprise", read_trust=True, read_trust_bias_init=-1.0)
    assert loud.model.memory.trust.weights.tolist() == [-1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    tiny_model(std=0.3, key_binding="bind", write_signal="surprise").save_pretrained(tmp_path)
    added = KathleenForCausalLM.from_pretrained(tmp_path, read_trust=True, read_trust_bias_init=0.5)
    assert added.model.memory.trust.weights[0].item() == 0.5
    default = KathleenForCausalLM.from_pretrained(tmp_path, read_trust=True)
    assert default.model.memory.trust.weights[0].item() == INITIAL_BIAS  # control: the setting is what moved it
    for bad in (float("nan"), "loud", True):
        with pytest.raises(ValueError, match="read_trust_bias_init"):
            KathleenConfig(read_trust_bias_init=bad)


def fit(tmp_path, checkpoint, steps: int, extra: tuple[str, ...] = ()) -> tuple[Path, dict]:
    rng = random.Random(0)
    text = tmp_path / "prose.txt"
    text.write_text(" ".join(rng.choice(WORDS) for _ in range(30_000)))
    out = tmp_path / "-".join(["fitted", str(steps), *(x.strip("-") for x in extra)])
    subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_read_trust.py"), str(checkpoint), str(out),
                    "--data", str(text), "--train-bytes", "0:100000", "--validation-bytes", "100000:160000",
                    "--lengths", "1024", "--documents", "4", "--plain", "1", "--steps", str(steps), "--batch", "512",
                    *extra],
                   check=True, capture_output=True, text=True)
    return out, json.loads((out / "read_trust.json").read_text())


def test_fitting_lowers_the_loss_and_is_saved(tmp_path):
    checkpoint = tmp_path / "model"
    tiny_model(std=0.3, key_binding="bind", write_signal="surprise").save_pretrained(checkpoint)
    out, record = fit(tmp_path, checkpoint, steps=150)
    assert record["after"]["fit"]["bits_per_byte"] < record["before"]["fit"]["bits_per_byte"] - 1e-3
    model = KathleenForCausalLM.from_pretrained(out)
    assert model.config.read_trust
    torch.testing.assert_close(model.model.memory.trust.weights, torch.tensor(record["weights"]))
    _, unfitted = fit(tmp_path, checkpoint, steps=0)  # control: the initial, almost silent trust changes ~nothing
    assert abs(unfitted["after"]["fit"]["bits_per_byte"] - unfitted["before"]["fit"]["bits_per_byte"]) < 1e-2
    assert record["after"]["fit"]["bits_per_byte"] < unfitted["after"]["fit"]["bits_per_byte"] - 1e-3


@pytest.mark.parametrize("flag", ["--keep-repeat-read-scale", "--repeat-read-trust"])
def test_a_repeat_bank_option_on_a_model_without_one_is_refused(tmp_path, flag):
    tiny_model(key_binding="bind", write_signal="surprise").save_pretrained(tmp_path / "model")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_read_trust.py"), str(tmp_path / "model"),
                          str(tmp_path / "out"), flag], capture_output=True, text=True)
    assert run.returncode != 0 and f"{flag}: " in run.stderr and "has no repeat bank" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()


def test_a_corpus_too_small_is_refused(tmp_path):
    tiny_model().save_pretrained(tmp_path / "model")
    (tmp_path / "small.txt").write_text("a few words only")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_read_trust.py"), str(tmp_path / "model"),
                          str(tmp_path / "out"), "--data", str(tmp_path / "small.txt")], capture_output=True, text=True)
    assert run.returncode != 0 and "--train-bytes holds 16 bytes" in run.stderr
    assert not (tmp_path / "out").exists()


def test_fit_documents_at_every_length_even_past_the_names():
    """The fit's documents: n_facts fact documents and n_plain plain windows at each length, also where a length
    has room for more facts than the training part has names (16 KB: 64 > 40)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fit_read_trust", ROOT / "scripts" / "fit_read_trust.py")
    fit_read_trust = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_read_trust)
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(12_000)).encode()
    texts = fit_read_trust.documents(text, [512, 16384], 2, 1, random.Random(1))
    assert [len(ids) for ids, _, _ in texts] == [512] * 3 + [16384] * 3
    assert [bool(values.any()) for _, values, _ in texts] == [True, True, False] * 2  # plain windows restate nothing
    assert all(len(first) == len(ids) and first.any() for ids, _, first in texts)


def test_the_noise_cap_bounds_the_crosstalk_the_linear_read_passes():
    """With c = 0.1 nats, a read of pure crosstalk (σ = 2) passes at σ ≈ 0.1 and keeps its shape; a clean read
    (σ ≪ c) and an all-zero row pass almost unchanged; the never-binding initial cap changes nothing (the control)."""
    from modeling_kathleen_notebook.read_trust import ReadTrust, crosstalk_variance

    torch.manual_seed(0)
    trust = ReadTrust()
    with torch.no_grad():
        trust.weights.copy_(torch.tensor([-30.0, 0, 0, 0, 0, 0]))  # k ≈ 0: the linear part alone
    noise, trunk = 2.0 * torch.randn(4, 259), torch.zeros(4, 259)
    clean = 0.01 * torch.randn(1, 259)
    torch.testing.assert_close(trust(noise, trunk), noise)  # control: e^10 nats never binds
    with torch.no_grad():
        trust.log_noise_cap.fill_(torch.tensor(0.1).log().item())
    capped = trust(noise, trunk)
    torch.testing.assert_close(crosstalk_variance(capped).sqrt(), torch.full((4, 1), 0.1), rtol=1e-2, atol=0)
    torch.testing.assert_close(capped / capped.norm(dim=-1, keepdim=True), noise / noise.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(trust(clean, trunk[:1]), clean, rtol=1e-2, atol=0)
    assert torch.equal(trust(torch.zeros(2, 259), trunk[:2]), torch.zeros(2, 259))


def test_a_trust_saved_before_the_cap_loads_with_a_cap_that_never_binds(tmp_path):
    from safetensors.torch import load_file, save_file

    model = tiny_model(std=0.3, key_binding="bind", write_signal="surprise", read_trust=True,
                       read_noise_cap_init=0.03)
    with torch.no_grad():
        model.model.memory.trust.weights.copy_(torch.tensor([1.0, 0.5, 0.2, 0.1, 0.0, -0.1]))
        model.model.memory.trust.log_noise_cap.fill_(-1.0)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.memory.trust.log_noise_cap"]  # as written before the cap existed
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    del config["read_noise_cap_init"]  # nor did its setting
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = KathleenForCausalLM.from_pretrained(tmp_path).model.memory.trust
    torch.testing.assert_close(loaded.weights, model.model.memory.trust.weights)
    assert loaded.log_noise_cap.item() == 10.0 != model.model.memory.trust.log_noise_cap.item()


def test_fitting_the_read_alone_with_a_cap(tmp_path):
    """--features read keeps the trunk statistics' weights at zero; --noise-cap fits c (saved in the record);
    --fact-weight weighs the restated values found in the fit's fact documents."""
    checkpoint = tmp_path / "model"
    tiny_model(std=0.3, key_binding="bind", write_signal="surprise").save_pretrained(checkpoint)
    out, record = fit(tmp_path, checkpoint, steps=60, extra=["--features", "read", "--noise-cap", "--fact-weight", "5"])
    assert record["features"] == "read" and record["weights"][3:] == [0.0, 0.0, 0.0]
    assert record["fact_weight"] == 5.0 and record["value_positions"] > 0
    assert record["after"]["plain"]["value_accuracy"] is None  # plain windows restate nothing
    assert record["weights"][:3] != initial_weights(INITIAL_BIAS).tolist()[:3] and record["noise_cap"] != 1.0
    trust = KathleenForCausalLM.from_pretrained(out).model.memory.trust
    assert trust.log_noise_cap.exp().item() == pytest.approx(record["noise_cap"])


def test_the_compiled_trust_equals_the_pytorch_ops():
    """kernels.cpp's read_trust against ReadTrust.forward_reference (fp32, 1e-4) on reads of crosstalk alone, with
    a clean hit, tied bytes, an all-zero row and trunk logits broadcast over positions (one with its top tied, one
    so sure that its softmax underflows); a changed threshold moves the result (the control: the comparison sees
    τ)."""
    from modeling_kathleen_notebook.kernels import fourier_kernels
    from modeling_kathleen_notebook.read_trust import ReadTrust

    assert fourier_kernels() is not None, "the CPU kernels did not build (see the log): a compiler and ninja?"
    torch.manual_seed(0)
    trust = ReadTrust()
    with torch.no_grad():
        trust.weights.copy_(torch.tensor([6.4, -3.7, 0.7, -0.15, 0.14, -0.28]))
        trust.threshold.fill_(2.6)
        trust.log_noise_cap.fill_(-2.9)
    reads = torch.randn(5, 7, 259) * torch.tensor([0.01, 0.3, 1.0, 4.0, 0.0]).view(5, 1, 1)
    reads[1, :, 40] += 2.0  # a clean hit
    reads[2, :, 50] = reads[2, :, 60] = 9.0  # two bytes tied for the top
    trunk = 3 * torch.randn(5, 1, 259)  # one row per sequence, broadcast over its positions
    trunk[0, :, 10] = trunk[0, :, 20] = 30.0  # the trunk's top tied
    trunk[3, :, 7] = 200.0  # a sure trunk: every other exponent of its softmax far below fp32's range
    with torch.no_grad():
        compiled = trust(reads, trunk)
        reference = trust.forward_reference(reads, trunk)
        torch.testing.assert_close(compiled, reference, rtol=0, atol=1e-4)
        assert torch.equal(compiled[4], torch.zeros(7, 259))  # an empty memory gains nothing
        trust.threshold.fill_(2.0)
        assert (trust(reads, trunk) - compiled).abs().max() > 0.1


def test_the_compiled_trust_backward_equals_autograd_of_the_pytorch_ops():
    """kernels.cpp's read_trust_backward (CompiledReadTrust, what training runs) against autograd through
    ReadTrust.forward_reference: the gradients of the reads, of trunk logits broadcast over positions, and of θ, τ
    and log c, for reads of crosstalk at several scales, clean hits that pass τ, a constant row (the std's floor),
    an all-zero row, a trunk with its top tied (amax shares its gradient among ties) and one whose softmax
    underflows. Every gradient is nonzero (the comparison sees each), and the compiled path is the one that ran (the
    control: a wrong threshold's gradient differs)."""
    from modeling_kathleen_notebook.read_trust import CompiledReadTrust, ReadTrust

    torch.manual_seed(1)
    trust = ReadTrust()
    with torch.no_grad():
        trust.weights.copy_(torch.tensor([0.4, 0.9, 0.7, -0.15, 0.14, -0.28]))
        trust.threshold.fill_(2.6)
        trust.log_noise_cap.fill_(-1.5)
    reads = torch.randn(6, 9, 259) * torch.tensor([0.01, 0.3, 1.0, 4.0, 0.0, 1.0]).view(6, 1, 1)
    reads[1, :, 40] += 2.0  # clean hits
    reads[2, :, 50] += 9.0
    reads[5] = 0.25  # a constant row: std below its floor, no crosstalk
    trunk = 3 * torch.randn(6, 1, 259)
    trunk[0, :, 10] = trunk[0, :, 20] = 30.0  # the trunk's top tied
    trunk[3, :, 7] = 200.0  # a sure trunk: its softmax underflows
    weights = torch.randn(6, 9, 259)
    params = list(trust.parameters())

    def gradients(run):
        inputs = [reads.clone().requires_grad_(), trunk.clone().requires_grad_()]
        return torch.autograd.grad((run(*inputs) * weights).sum(), inputs + params)

    applied = []
    original = CompiledReadTrust.apply
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CompiledReadTrust, "apply", lambda *a: applied.append(1) or original(*a))
        compiled = gradients(trust)
    assert applied, "training did not take the compiled path"
    reference = gradients(trust.forward_reference)
    for ours, theirs in zip(compiled, reference):
        assert theirs.abs().max() > 0
        torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-4 * theirs.abs().max().item())
    with torch.no_grad():
        trust.threshold.fill_(1.0)
    assert not torch.allclose(gradients(trust)[3], reference[3])



def test_read_outs_are_kept_for_a_later_fit_of_the_same_model_on_the_same_documents(tmp_path):
    """--read-outs: a second fit starts from what the first read (its untrusted scores are those of the first); other
    documents (another seed) are read again (the control), and so are a file of an older format and a damaged
    file."""
    checkpoint, kept, prose = tmp_path / "model", tmp_path / "read-outs.pt", tmp_path / "prose.txt"
    tiny_model(std=0.3, key_binding="bind", write_signal="surprise").save_pretrained(checkpoint)
    rng = random.Random(0)
    prose.write_text(" ".join(rng.choice(WORDS) for _ in range(30_000)))

    def fit_with_read_outs(seed: int, name: str) -> tuple[str, dict]:
        out = tmp_path / name
        run = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_read_trust.py"), str(checkpoint), str(out),
                              "--data", str(prose), "--train-bytes", "0:100000", "--validation-bytes", "100000:160000",
                              "--lengths", "1024", "--documents", "2", "--plain", "1", "--steps", "5", "--batch", "256",
                              "--seed", str(seed), "--read-outs", str(kept)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return run.stdout, json.loads((out / "read_trust.json").read_text())

    first, a = fit_with_read_outs(0, "a")
    second, b = fit_with_read_outs(0, "b")
    assert "read-outs from" not in first and "read-outs from" in second
    assert a["before"] == b["before"]
    other, c = fit_with_read_outs(1, "c")
    assert "reading again" in other and c["before"] != a["before"]  # control: other documents are read again
    saved = torch.load(kept, weights_only=True)  # the same read-outs under the key of the format before 2
    assert json.loads(saved["key"])[0] == 2  # the key names the format: a file of another format has another key
    saved["key"] = json.dumps(json.loads(saved["key"])[1:], sort_keys=True, default=str)
    torch.save(saved, kept)
    older, e = fit_with_read_outs(1, "e")
    assert "reading again" in older and e["before"] == c["before"]
    kept.write_bytes(kept.read_bytes()[:100])
    damaged, d = fit_with_read_outs(1, "d")
    assert "unreadable" in damaged and d["before"] == c["before"]


def test_weighing_first_mentions_lowers_their_cost(tmp_path):
    """--first-mention-weight: the fitted trust's first-mention cost on its fitting data falls below that of the
    same fit without the weight (the control), which is reported beside it."""
    checkpoint = tmp_path / "model"
    tiny_model(std=0.3, key_binding="bind", write_signal="surprise").save_pretrained(checkpoint)
    _, plain = fit(tmp_path, checkpoint, steps=150)
    _, weighed = fit(tmp_path, checkpoint, steps=150, extra=("--first-mention-weight", "20"))
    assert plain["first_mention_weight"] == 0 and weighed["first_mention_weight"] == 20
    assert weighed["after"]["fit"]["first_mention_cost"] < plain["after"]["fit"]["first_mention_cost"] - 1e-3


def test_a_new_notebook_caps_its_crosstalk_from_the_start():
    """KathleenConfig()'s read trust starts with its cap at 0.03 nats, so a memory crowded far past anything a
    512-byte training window fills passes at most that much crosstalk into every byte's logits; with the cap unbound
    (read_noise_cap_init=None, what configs written before the setting load as) the same memory passes nats of it
    (the control)."""
    from modeling_kathleen_notebook import KathleenConfig
    from modeling_kathleen_notebook.read_trust import crosstalk_variance

    assert KathleenConfig().read_noise_cap_init == 0.03
    assert KathleenConfig.from_dict({"model_type": "kathleen_notebook"}).read_noise_cap_init is None
    for bad in (0.0, -1.0, float("inf"), "0.03", True):
        with pytest.raises(ValueError, match="read_noise_cap_init"):
            KathleenConfig(read_noise_cap_init=bad)
    ids = torch.randint(3, 259, (1, 6000), generator=torch.Generator().manual_seed(0))
    crosstalk = {}
    for cap in (0.03, None):
        model = tiny_model(key_binding="bind", write_signal="surprise", read_trust=True, read_noise_cap_init=cap)
        with torch.no_grad():
            model.model.memory.read_scale.fill_(8.0)  # a loud read: a crowded memory's crosstalk is nats
            memory_logits = model(ids[:, :-1]).memory_logits[0, -1000:]
        crosstalk[cap] = crosstalk_variance(memory_logits).sqrt().max().item()
    assert crosstalk[0.03] <= 0.031 and crosstalk[None] > 1.0, crosstalk


REPEAT_BANK = dict(key_binding="bind", write_signal="surprise", key_window=16, repeat_key_window=4)


def test_the_read_outs_keep_a_repeat_banks_read_apart_at_unit_scale():
    """fit_read_trust's read-outs of a model with a repeat bank: first read + s' · repeat read is the model's own
    untrusted memory read at repeat read scale s', for any s'; the first read alone is not (the control)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fit_read_trust", ROOT / "scripts" / "fit_read_trust.py")
    fit_read_trust = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_read_trust)
    model = tiny_model(std=0.3, **REPEAT_BANK).eval()
    ids = torch.randint(3, 259, (300,))
    masks = torch.zeros(300, dtype=torch.bool), torch.ones(300, dtype=torch.bool)
    loaded = model.model.memory.repeat_read_scale.item()
    data = fit_read_trust.read_outs(model, [(ids, *masks)], "reading")
    assert model.model.memory.repeat_read_scale.item() == loaded  # read at scale 1, then put back
    assert "forward" not in vars(model.model.memory)  # the recording is undone
    for scale in (0.5, -2.0):
        with torch.no_grad():
            model.model.memory.repeat_read_scale.fill_(scale)
            expected = model(ids.unsqueeze(0), use_cache=False).memory_logits[0, :-1]
        torch.testing.assert_close(fit_read_trust.memory_logits(model.model.memory, data, scale), expected,
                                   rtol=1e-5, atol=1e-5)
        assert (data[1] - expected).abs().max() > 1e-3  # control: the repeat bank's read is in it


def test_a_repeat_banks_read_scale_is_fitted_with_the_trust_unless_kept(tmp_path):
    checkpoint = tmp_path / "model"
    tiny_model(std=0.3, **REPEAT_BANK).save_pretrained(checkpoint)
    initial = KathleenForCausalLM.from_pretrained(checkpoint).model.memory.repeat_read_scale.item()
    out, record = fit(tmp_path, checkpoint, steps=150)
    assert abs(record["repeat_read_scale"] - initial) > 1e-2
    assert record["after"]["fit"]["bits_per_byte"] < record["before"]["fit"]["bits_per_byte"] - 1e-3
    assert KathleenForCausalLM.from_pretrained(out).model.memory.repeat_read_scale.item() == record["repeat_read_scale"]
    kept_out, kept = fit(tmp_path, checkpoint, steps=150, extra=("--keep-repeat-read-scale",))  # the control
    assert kept["repeat_read_scale"] == initial
    assert KathleenForCausalLM.from_pretrained(kept_out).model.memory.repeat_read_scale.item() == initial


def test_a_trust_per_memory_is_added_fitted_and_saved(tmp_path):
    """--repeat-read-trust gives a repeat bank's read a trust of its own and fits it with the first's; the model
    saved loads with both, each as recorded."""
    checkpoint = tmp_path / "model"
    tiny_model(std=0.3, read_trust=True, **REPEAT_BANK).save_pretrained(checkpoint)
    out, record = fit(tmp_path, checkpoint, steps=150, extra=("--repeat-read-trust",))
    assert record["after"]["fit"]["bits_per_byte"] < record["before"]["fit"]["bits_per_byte"] - 1e-3
    model = KathleenForCausalLM.from_pretrained(out)
    assert model.config.repeat_read_trust
    notebook = model.model.memory
    torch.testing.assert_close(notebook.trust.weights, torch.tensor(record["weights"]))
    torch.testing.assert_close(notebook.repeat_trust.weights, torch.tensor(record["repeat_trust"]["weights"]))
    # control: the repeat bank's trust was fitted, not left as the config's initial one
    assert (notebook.repeat_trust.weights - initial_weights(model.config.read_trust_bias_init)).abs().max() > 1e-2
    _, one_trust = fit(tmp_path, checkpoint, steps=150)
    assert one_trust["repeat_trust"] is None


def test_the_repeat_read_scale_starts_where_asked_and_cannot_also_be_kept(tmp_path):
    checkpoint = tmp_path / "model"
    tiny_model(std=0.3, **REPEAT_BANK).save_pretrained(checkpoint)
    _, record = fit(tmp_path, checkpoint, steps=0, extra=("--repeat-read-scale-init", "0.375"))
    assert record["repeat_read_scale"] == 0.375
    _, loaded = fit(tmp_path, checkpoint, steps=0)  # control: without it the scale is the checkpoint's
    assert loaded["repeat_read_scale"] != 0.375
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_read_trust.py"), str(checkpoint),
                          str(tmp_path / "out"), "--repeat-read-scale-init", "1", "--keep-repeat-read-scale"],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "contradict" in run.stderr and "Traceback" not in run.stderr
