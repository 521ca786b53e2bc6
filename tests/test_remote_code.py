"""The Hub path: a saved folder (or a Hub cache snapshot) loads in a fresh offline process that has
never imported this package, through the Auto classes with trust_remote_code, with identical logits."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import modeling_kathleen_notebook
from conftest import run_fresh_python, tiny_model
from modeling_kathleen_notebook import KathleenForCausalLM

PROMPT = [10, 20, 30, 40, 50, 60, 70, 80]

LOAD_ALL = """
import sys, torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
source = {source!r}
config = AutoConfig.from_pretrained(source, trust_remote_code=True)
lm = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=True).eval()
base = AutoModel.from_pretrained(source, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=True)
assert "modeling_kathleen_notebook" not in sys.modules, "the package leaked into the remote-code process"
ids = torch.tensor([{prompt}])
with torch.no_grad():
    save_file({{"logits": lm(ids).logits, "hidden": base(ids).last_hidden_state}}, "out.safetensors")
print(type(config).__name__, type(lm).__module__, tokenizer("ab")["input_ids"])
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoint")
    model = tiny_model(std=0.3)
    model.save_pretrained(folder)
    with torch.no_grad():
        ids = torch.tensor([PROMPT])
        expected = {"logits": model(ids).logits, "hidden": model.model(ids).last_hidden_state}
    return folder, expected


def test_saved_folder_is_flat_and_complete(saved):
    folder, _ = saved
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "modeling_kathleen.py", "configuration_kathleen.py", "notebook.py", "trunk.py", "cache.py"} <= names
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM"}
    assert json.loads((folder / "generation_config.json").read_text())["max_new_tokens"] >= 100


def test_fresh_process_loads_folder_with_identical_logits(saved, tmp_path):
    folder, expected = saved
    stdout = run_fresh_python(LOAD_ALL.format(source=str(folder), prompt=PROMPT), cwd=tmp_path)
    assert "KathleenConfig transformers_modules" in stdout and "[100, 101]" in stdout
    got = load_file(tmp_path / "out.safetensors")
    assert torch.equal(got["logits"], expected["logits"])
    assert torch.equal(got["hidden"], expected["hidden"])


def test_hub_cache_snapshot_loads_offline_by_repo_id(saved, tmp_path):
    folder, expected = saved
    home = tmp_path / "hf_home"
    repo = home / "hub" / "models--kathleen--tiny-notebook"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    work = tmp_path / "work"
    work.mkdir()
    run_fresh_python(LOAD_ALL.format(source="kathleen/tiny-notebook", prompt=PROMPT), cwd=work, HF_HOME=str(home))
    assert torch.equal(load_file(work / "out.safetensors")["logits"], expected["logits"])


def test_cache_saved_to_disk_continues_in_a_fresh_process(saved, tmp_path):
    folder, _ = saved
    model = KathleenForCausalLM.from_pretrained(folder).eval()
    first = model.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                           return_dict_in_generate=True)
    first.cache.save(tmp_path / "memory.safetensors")
    save_file({"sequences": first.sequences}, tmp_path / "sequences.safetensors")
    expected = model.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, eos_token_id=None)
    code = f"""
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
cache_class = type(model.model.trunk).__module__.rsplit(".", 1)[0] + ".cache"
import importlib
KathleenCache = importlib.import_module(cache_class).KathleenCache
cache = KathleenCache.load("memory.safetensors", model.config)
sequences = load_file("sequences.safetensors")["sequences"]
more = model.generate(sequences, cache=cache, max_new_tokens=6, do_sample=False, eos_token_id=None)
save_file({{"more": more}}, "more.safetensors")
"""
    run_fresh_python(code, cwd=tmp_path)
    assert torch.equal(load_file(tmp_path / "more.safetensors")["more"], expected)


def test_truncated_weights_raise_a_clear_error(saved, tmp_path):
    folder, _ = saved
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        KathleenForCausalLM.from_pretrained(broken)



def test_settings_that_do_not_fit_the_weights_are_named_through_the_auto_classes(saved, tmp_path):
    """AutoModelForCausalLM reads n_layers= / d_model= into a config and passes that on: the remote code still
    names the setting, and refuses fewer blocks than the weights instead of dropping trained ones."""
    folder, _ = saved
    code = f"""
from transformers import AutoModelForCausalLM
for settings in (dict(n_layers=1), dict(d_model=32), dict()):
    try:
        AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True, **settings)
        print(settings, "loaded")
    except ValueError as error:
        print(settings, error)
"""
    seen = run_fresh_python(code, cwd=tmp_path).splitlines()
    blocks = json.loads((folder / "config.json").read_text())["n_layers"]
    assert f"with n_layers=1: the checkpoint holds {blocks} model.trunk.blocks where the config builds 1" in seen[0]
    assert "with d_model=32: lm_head.weight: checkpoint (259, 24) vs config (259, 32)" in seen[1]
    assert seen[2] == "{} loaded"  # control: the checkpoint's own config

def test_tokenizer_loads_without_custom_code_and_without_a_prompt(saved, tmp_path):
    """The card's tokenizer line: a plain tokenizer.json, so trust_remote_code=False loads it with no custom code
    and no question. Control: without the argument, AutoTokenizer reads config.json's auto_map and asks (a 15 s
    wait at a terminal; here stdin is closed, so it falls back at once)."""
    folder, _ = saved
    code = ("from transformers import AutoTokenizer\n"
            f"tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}{{}})\n"
            "print(type(tokenizer).__name__, tokenizer('ab')['input_ids'])")
    card = run_fresh_python(code.format(", trust_remote_code=False"), cwd=tmp_path)
    assert "Do you wish to run the custom code" not in card and "[100, 101]" in card
    assert "Do you wish to run the custom code" in run_fresh_python(code.format(""), cwd=tmp_path)


def test_after_the_remote_model_loads_the_auto_classes_need_no_flag(saved, tmp_path):
    """The common snippet: the model with trust_remote_code=True, then the tokenizer (and config, model) without it.
    The remote config registers its model type, so nothing asks whether to run custom code and the classes are the
    remote ones. The control is the previous test's: without the model loaded first, the same tokenizer call asks."""
    folder, _ = saved
    code = f"""
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
lm = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained({str(folder)!r})
config = AutoConfig.from_pretrained({str(folder)!r})
again = AutoModelForCausalLM.from_pretrained({str(folder)!r})
print(tokenizer('ab')['input_ids'], type(config) is type(lm.config), type(again) is type(lm))
print(type(lm).__module__)
"""
    out = run_fresh_python(code, cwd=tmp_path)
    assert "Do you wish to run the custom code" not in out
    assert "[100, 101] True True" in out and out.split()[-1].startswith("transformers_modules.")


def test_shipped_folder_itself_loads_as_remote_code(tmp_path):
    """The folder users get (not a re-saved copy): a module missing from it would fail here."""
    from modeling_kathleen_notebook.session import DEFAULT_CHECKPOINT

    # its notebook writes by the trunk's surprise, so AutoModel (no byte head) refuses it by design: the LM only
    code = f"""
import sys, torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained({str(DEFAULT_CHECKPOINT)!r}, trust_remote_code=True)
lm = AutoModelForCausalLM.from_pretrained({str(DEFAULT_CHECKPOINT)!r}, trust_remote_code=True).eval()
assert "modeling_kathleen_notebook" not in sys.modules, "the package leaked into the remote-code process"
with torch.no_grad():
    save_file({{"logits": lm(torch.tensor([{PROMPT}])).logits}}, "out.safetensors")
kernels = sys.modules[type(lm).__module__.rsplit(".", 1)[0] + ".kernels"]
print(type(config).__name__, type(lm).__module__, "kernels:", kernels.notebook_path())
"""
    stdout = run_fresh_python(code, cwd=tmp_path, HF_MODULES_CACHE=str(tmp_path / "modules"))
    assert "KathleenConfig transformers_modules" in stdout
    # kernels.cpp came with the folder (Transformers copies the Python files only): the compiled path runs
    assert "kernels: compiled CPU kernels" in stdout, stdout
    model = KathleenForCausalLM.from_pretrained(DEFAULT_CHECKPOINT).eval()
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits
    assert torch.allclose(load_file(tmp_path / "out.safetensors")["logits"], expected, atol=1e-5)


def test_the_shipped_folder_carries_the_packages_own_code():
    """The shipped folder's remote code is the package's: each of its modules and its kernels.cpp is byte for byte
    the package's file of that name (a change to the package must be copied there, or remote-code users run the
    old code). The control: the folder holds such files at all."""
    from modeling_kathleen_notebook.session import DEFAULT_CHECKPOINT

    package = Path(modeling_kathleen_notebook.__file__).parent
    copies = sorted(path for path in Path(DEFAULT_CHECKPOINT).iterdir() if path.suffix in (".py", ".cpp"))
    assert len(copies) > 10 and any(path.name == "kernels.cpp" for path in copies)
    stale = [path.name for path in copies if path.read_bytes() != (package / path.name).read_bytes()]
    assert not stale, f"copy the package's {stale} into {DEFAULT_CHECKPOINT}"


def test_a_checkpoint_missing_a_module_fails_to_load(tmp_path):
    """Control for the test above: the same load fails when one module is absent from the folder."""
    from modeling_kathleen_notebook.session import DEFAULT_CHECKPOINT

    broken = tmp_path / "broken"
    shutil.copytree(DEFAULT_CHECKPOINT, broken)
    (broken / "read_trust.py").unlink()
    code = (f"from transformers import AutoModelForCausalLM\n"
            f"AutoModelForCausalLM.from_pretrained({str(broken)!r}, trust_remote_code=True)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1",
                               "HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert done.returncode != 0 and "read_trust" in done.stderr


def test_a_checkpoint_without_the_kernel_source_still_runs(tmp_path):
    """Control for the kernel check above: without kernels.cpp the remote code says so and runs its PyTorch ops."""
    from modeling_kathleen_notebook.session import DEFAULT_CHECKPOINT

    bare = tmp_path / "bare"
    shutil.copytree(DEFAULT_CHECKPOINT, bare)
    (bare / "kernels.cpp").unlink()
    code = f"""
import sys, torch
from transformers import AutoModelForCausalLM
lm = AutoModelForCausalLM.from_pretrained({str(bare)!r}, trust_remote_code=True).eval()
kernels = sys.modules[type(lm).__module__.rsplit(".", 1)[0] + ".kernels"]
print(lm(torch.tensor([{PROMPT}])).logits.shape, "kernels:", kernels.notebook_path())
"""
    stdout = run_fresh_python(code, cwd=tmp_path, HF_MODULES_CACHE=str(tmp_path / "modules"))
    assert "kernels: PyTorch ops" in stdout and "torch.Size([1, " in stdout


def test_each_checkpoint_brings_its_own_kernel_source_to_the_remote_code(tmp_path):
    """Transformers' modules cache keeps one remote-code copy per set of Python files (and folder name), so
    checkpoints that differ only in kernels.cpp share it: each load puts its own checkpoint's source there, and a
    checkpoint without one takes it away (its PyTorch ops run). Before, the first checkpoint's source stayed and a
    changed kernel was compiled from a stale file. Control: the two sources differ, so the assertions see which one
    the copy holds."""
    model = tiny_model()
    folders = [tmp_path / name / "checkpoint" for name in ("old", "new", "bare")]
    for folder in folders:
        model.save_pretrained(folder)
    new_source = folders[1] / "kernels.cpp"
    new_source.write_text(new_source.read_text() + "\n// a later revision of the kernels\n")
    (folders[2] / "kernels.cpp").unlink()
    assert (folders[0] / "kernels.cpp").read_bytes() != new_source.read_bytes()
    code = """
import sys
from transformers import AutoModelForCausalLM
lm = AutoModelForCausalLM.from_pretrained({folder!r}, trust_remote_code=True)
kernels = sys.modules[type(lm).__module__.rsplit(".", 1)[0] + ".kernels"]
print(kernels.source_path().read_text()[-60:] if kernels.source_path().exists() else "no source", "|",
      kernels.notebook_path())
"""
    seen = [run_fresh_python(code.format(folder=str(folder)), cwd=tmp_path, HF_MODULES_CACHE=str(tmp_path / "modules"))
            for folder in folders]
    assert "a later revision" not in seen[0] and "compiled CPU kernels" in seen[0]
    assert "a later revision of the kernels" in seen[1]
    assert "no source" in seen[2] and "PyTorch ops" in seen[2]


def test_a_repeat_bank_with_a_trust_of_its_own_loads_as_remote_code(tmp_path):
    model = tiny_model(std=0.3, key_binding="bind", key_window=16, repeat_key_window=4, read_trust=True,
                       repeat_read_trust=True)  # gate writes: LOAD_ALL also runs the bare AutoModel
    model.save_pretrained(tmp_path / "checkpoint")
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits
        # control: read through one trust of the sum, the same weights give other logits
        one_trust = KathleenForCausalLM.from_pretrained(tmp_path / "checkpoint", repeat_read_trust=False).eval()
        assert (one_trust(torch.tensor([PROMPT])).logits - expected).abs().max() > 1e-3
    work = tmp_path / "work"
    work.mkdir()
    run_fresh_python(LOAD_ALL.format(source=str(tmp_path / "checkpoint"), prompt=PROMPT), cwd=work)
    assert torch.equal(load_file(work / "out.safetensors")["logits"], expected)
