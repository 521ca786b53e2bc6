"""The `kathleen-notebook` command: memory files built and queried across separate calls."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_model
from modeling_kathleen_notebook import KathleenForCausalLM

ROOT = Path(__file__).resolve().parents[1]

CLI = [sys.executable, "-m", "modeling_kathleen_notebook.cli"]


def run(*args, cwd):
    result = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_memory_commands_across_calls(tmp_path):
    tiny_model(std=0.3).save_pretrained(tmp_path / "model")
    (tmp_path / "facts.txt").write_text("Ada lives in Paris. Bob lives in Rome. Cy lives in Oslo.\n")
    out = run("memory", "read", "mem.safetensors", "facts.txt", "--model", str(tmp_path / "model"), cwd=tmp_path)
    assert "3 segments" in out
    shown = json.loads(run("memory", "show", "mem.safetensors", cwd=tmp_path).splitlines()[-1])
    assert shown["bytes_read"] == 57 and shown["segments"] == 3 and shown["write_mass"] > 0
    answer = run("memory", "ask", "mem.safetensors", "Ada lives", "--max-new-tokens", "5", cwd=tmp_path)
    assert answer.endswith("\n") and "bytes_read" not in answer  # stdout: the answer alone, the summary on stderr
    lines = run("memory", "attribute", "mem.safetensors", "Bob lives in", "--max-new-tokens", "4", cwd=tmp_path)
    assert lines.count("trunk") == 4 and "facts.txt" in lines and "bytes_read" not in lines
    out = run("memory", "unlearn", "mem.safetensors", "Bob lives in Rome.", cwd=tmp_path)
    assert "1 occurrence" in out
    shown = json.loads(run("memory", "show", "mem.safetensors", cwd=tmp_path).splitlines()[-1])
    assert shown["erased_positions"] == len("Bob lives in Rome.")


def test_a_memory_file_finds_its_model_from_another_directory(tmp_path):
    """A memory built with a relative --model records the folder absolute: asked from elsewhere, it still loads."""
    tiny_model(std=0.3).save_pretrained(tmp_path / "model")
    (tmp_path / "facts.txt").write_text("Ada lives in Paris.\n")
    run("memory", "read", "mem.safetensors", "facts.txt", "--model", "model", cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    answer = run("memory", "ask", str(tmp_path / "mem.safetensors"), "Ada lives", "--max-new-tokens", "3",
                 cwd=elsewhere)
    assert answer.endswith("\n")


def test_memory_unlearn_clears_shared_short_keys_when_asked(tmp_path):
    tiny_model(key_binding="bind", write_signal="surprise", key_window=16, repeat_key_window=4).save_pretrained(
        tmp_path / "model")
    (tmp_path / "facts.txt").write_text("The code of Marlow is QX7RZ. The code of Tessa is BK44P.\n")
    cleared = {}
    for flag in ([], ["--clear-shared-keys"]):  # the default leaves the others' writes (the control)
        memory = f"mem{len(flag)}.safetensors"
        run("memory", "read", memory, "facts.txt", "--model", str(tmp_path / "model"), cwd=tmp_path)
        run("memory", "unlearn", memory, "The code of Marlow is QX7RZ.", *flag, cwd=tmp_path)
        shown = json.loads(run("memory", "show", memory, cwd=tmp_path).splitlines()[-1])
        assert shown["erased_positions"] == len("The code of Marlow is QX7RZ.")
        cleared[bool(flag)] = shown["repeat_cleared_positions"]
    assert cleared[False] == 0 and cleared[True] > 5  # " is " -> B, "The " -> c, ... of Tessa's sentence


def test_a_new_memory_without_a_model_uses_the_shipped_checkpoint(tmp_path):
    from modeling_kathleen_notebook.session import DEFAULT_CHECKPOINT, NotebookSession

    (tmp_path / "a.txt").write_text("Ada lives in Paris.\n")
    out = run("memory", "read", "m.safetensors", "a.txt", cwd=tmp_path)
    assert "shipped checkpoint" in out and "--model" in out
    session = NotebookSession(KathleenForCausalLM.from_pretrained(DEFAULT_CHECKPOINT))
    session.load(str(tmp_path / "m.safetensors"))  # a memory of another model would raise here
    assert session.summary()["bytes_read"] == 20
    assert json.loads(run("memory", "show", "m.safetensors", cwd=tmp_path).splitlines()[-1])["bytes_read"] == 20


def failing(*args, cwd) -> str:
    """Run a command that must fail: one line on stderr, no traceback; returns that line."""
    result = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def test_bad_input_is_one_line_that_names_it(tmp_path):
    tiny_model(std=0.3).save_pretrained(tmp_path / "model")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "config.json").write_text("{}")
    assert "nothere.json does not exist" in failing("train", "nothere.json", cwd=tmp_path)
    assert "nothere.txt" in failing("eval-bpb", str(tmp_path / "model"), "nothere.txt", cwd=tmp_path)
    assert "empty.txt holds no bytes" in failing("eval-bpb", str(tmp_path / "model"), "empty.txt", cwd=tmp_path)
    assert "m.safetensors does not exist" in failing("memory", "ask", "m.safetensors", "hi", cwd=tmp_path)
    assert "needs a prompt" in failing("memory", "ask", "m.safetensors", " ", cwd=tmp_path)
    assert "needs at least one FILE" in failing("memory", "read", "m.safetensors", cwd=tmp_path)
    assert "unrecognized arguments: --nope" in failing("demo", "--nope", cwd=tmp_path)
    assert failing("memory", "show", cwd=tmp_path).endswith("required: memory")  # not the optional inputs too
    # a model path that is not there is named as one (Transformers would call it a malformed Hub repo id)
    for missing in (str(tmp_path / "nomodel"), "./nomodel"):
        assert f"no model folder {missing}" in failing("eval-bpb", missing, "empty.txt", cwd=tmp_path)
        assert f"no model folder {missing}" in failing("export", "x.onnx", "--model", missing, cwd=tmp_path)


def test_overrides_may_follow_resume(tmp_path):
    """--resume before, between or after the overrides: they all reach the config (an unknown key says so)."""
    preset = str(ROOT / "configuration" / "presets" / "text-notebook.json")
    for args in (["--resume", "train.nokey=1"], ["train.steps=3", "--resume", "train.nokey=1"],
                 ["train.nokey=1", "--resume"]):
        assert "unknown train key(s) ['nokey']" in failing("train", preset, *args, cwd=ROOT)
    assert "train.steps must be an integer, got 'abc'" in failing("train", preset, "train.steps=abc",
                                                                            cwd=ROOT)


def test_lm_eval_text_goes_where_asked(tmp_path):
    (tmp_path / "corpus.txt").write_text("0123456789")
    out = run("eval-bpb", "--write-lm-eval-text", "corpus.txt", "--byte-range", "2", "6", "--lm-eval-out", "t.txt",
              cwd=tmp_path)
    assert (tmp_path / "t.txt").read_text() == "2345" and "t.txt" in out
    assert not (tmp_path / "kathleen_eval_text.txt").exists()


def test_eval_bpb_shows_progress(tmp_path):
    tiny_model(std=0.3).save_pretrained(tmp_path / "model")
    (tmp_path / "text.txt").write_text("some text to score " * 50)
    result = subprocess.run([*CLI, "eval-bpb", str(tmp_path / "model"), "text.txt", "--chunk-size", "100"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "text.txt: 100%" in result.stderr and "950/950" in result.stderr


def test_every_option_of_every_command_says_what_it_does():
    import argparse

    from modeling_kathleen_notebook.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    silent = [f"{name} {action.dest}" for name, sub in commands.choices.items() for action in sub._actions
              if not isinstance(action, argparse._HelpAction) and not action.help]
    assert not silent, silent
    help_text = " ".join(a.help for a in commands.choices["memory"]._actions if a.help)
    assert "--text" not in help_text  # memory unlearn takes the text as arguments


COUNTS = {"threads", "trials", "facts", "window", "chunk_size", "documents", "max_new_tokens", "max_document_bytes",
          "parallel"}  # options that name how many of something: 0 or less is refused before anything runs
POSITIONALS = {"train": ["config.json"], "facts": ["model"], "memory": ["show", "m.safetensors"], "export": ["x.onnx"]}


def test_every_count_below_one_is_refused_by_the_parser(capsys):
    """Each count option of each command, given 0, -1 or a word, stops argparse with one line naming the option
    (torch.set_num_threads(0), a window of 0 and a chunk of 0 were tracebacks or odd messages). Control: a count
    that is accepted parses."""
    import argparse

    from modeling_kathleen_notebook.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    checked = []
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if action.dest not in COUNTS:
                continue
            flag, head = action.option_strings[0], [name, *POSITIONALS.get(name, [])]
            assert getattr(parser.parse_args([*head, flag, "3"]), action.dest) == 3
            for bad in ("0", "-1", "x"):
                with pytest.raises(SystemExit):
                    parser.parse_args([*head, flag, bad])
                assert f"argument {flag}: " in capsys.readouterr().err
            checked.append(f"{name} {flag}")
    assert {"demo --threads", "eval-bpb --window", "eval-bpb --chunk-size", "smoke --trials", "facts --documents",
            "serve --max-document-bytes", "memory --max-new-tokens"} <= set(checked)



def test_a_missing_or_empty_input_file_is_named_before_the_model_loads(tmp_path):
    (tmp_path / "notes.txt").write_text("Ada lives in Paris.\n")
    (tmp_path / "empty.txt").write_text("")
    tiny_model().save_pretrained(tmp_path / "broken-model")
    weights = tmp_path / "broken-model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # loading it fails: an error naming a file came first
    absent = str(tmp_path / "broken-model")
    assert "missing.txt is not a file" in failing("memory", "read", "m.safetensors", "notes.txt", "missing.txt",
                                                   "--model", absent, cwd=tmp_path)
    assert "empty.txt holds no bytes to read" in failing("eval-bpb", absent, "notes.txt", "empty.txt", cwd=tmp_path)
    assert "notes.txt [100, 200] holds no bytes to read" in failing("eval-bpb", absent, "notes.txt", "--byte-range",
                                                                     "100", "200", cwd=tmp_path)
    # control: with readable files the same commands get as far as loading the model, and say what is wrong there
    for command in (["memory", "read", "m.safetensors", "notes.txt", "--model", absent],
                    ["eval-bpb", absent, "notes.txt"]):
        assert "truncated or corrupted" in failing(*command, cwd=tmp_path)
    assert not (tmp_path / "m.safetensors").exists()

def test_the_demo_refuses_too_few_facts_before_it_loads(tmp_path):
    """The demo unlearns one fact and asks the others again: one fact was a ZeroDivisionError after a minute's work."""
    assert "give 2 to 22 facts, not 1" in failing("demo", "--facts", "1", cwd=tmp_path)
    assert "give 2 to 22 facts, not 23" in failing("demo", "--facts", "23", cwd=tmp_path)
