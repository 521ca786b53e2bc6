"""The memory workbench (`kathleen-notebook serve`): its page logic in-process, then the real page in a headless
Chromium driven by Playwright against a `kathleen-notebook serve` subprocess of the shipped checkpoint.

Browser tests skip where no Chromium is installed, except under CI (KATHLEEN_REQUIRE_BROWSER=1, set by
.ci/run after installing one), where a missing browser fails them."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("gradio")

from modeling_kathleen_notebook.configuration_kathleen import KathleenConfig  # noqa: E402
from modeling_kathleen_notebook.experiments.demo import DEMO_TEXT  # noqa: E402
from modeling_kathleen_notebook.modeling_kathleen import KathleenForCausalLM  # noqa: E402
from modeling_kathleen_notebook.session import (
    DEFAULT_CHECKPOINT,  # noqa: E402
    NotebookSession,  # noqa: E402
)
from modeling_kathleen_notebook.workbench import Answer, Workbench, document_text, provenance_html  # noqa: E402

FACT = "The door code for Captain Reyes is T4WN6I."
QUESTION = "The door code for Captain Reyes is"
OTHER_FACT = "When asked, Dr. Okafor gave the answer hammock."


def recalls(answer: str, value: str = "T4WN6I") -> bool:
    return answer.lstrip().startswith(value)


def fact_document() -> str:
    """Prose from the demo text with two planted facts, each its own line (so its own sentence)."""
    prose = DEMO_TEXT.read_text()
    return f"{prose[:600]}\n{FACT}\n{prose[600:1100]}\n{OTHER_FACT}\n{prose[1100:1500]}\n"


@pytest.fixture(scope="module")
def shipped() -> NotebookSession:
    torch.set_num_threads(1)
    return NotebookSession.from_pretrained(str(DEFAULT_CHECKPOINT))


def bench(shipped: NotebookSession) -> Workbench:
    return Workbench(NotebookSession(shipped.model, shipped.model_path), max_new_tokens=10)


def foreign_memory(path: Path) -> None:
    """A memory file of another (tiny) model."""
    torch.manual_seed(0)
    other = NotebookSession(KathleenForCausalLM(KathleenConfig(d_model=32, n_layers=1, hrr_dim=256)))
    other.read("A memory of a different model.")
    other.save(str(path))


def ask(workbench: Workbench, prompt: str) -> tuple[list[str], Answer]:
    return list(workbench.ask_stream(prompt)), workbench.last


# ---- page logic, no browser --------------------------------------------------------------------------


@pytest.mark.parametrize("data, message", [
    (b"", "is empty"), (b"  \n\t ", "is empty"), (b"text\x00\x01binary", "looks binary"),
    (b"caf\xe9 latin-1", "not UTF-8"), (b"x" * 101, "over this page's limit"),
])
def test_bad_documents_are_refused_with_a_reason(data, message):
    with pytest.raises(ValueError, match=message):
        document_text(data, "upload.txt", limit=100)
    assert document_text("café, naïve".encode(), "ok.txt", limit=100) == "café, naïve"  # control


def test_recalled_bytes_name_the_planted_sentence_and_unlearning_removes_it(shipped):
    workbench = bench(shipped)
    workbench.read(fact_document(), "alice.txt")
    pieces, answer = ask(workbench, QUESTION)
    assert recalls(answer.text)
    assert len(pieces) == len(answer.ids) and pieces[-1] == answer.text  # streamed byte by byte
    assert answer.cited()[0] == f"alice.txt: {FACT}"
    page = provenance_html(answer)
    assert 'class="kn-recalled" data-sentence="0"' in page and FACT in page

    workbench.unlearn(answer.cited()[0], whole_source=False)
    _, after = ask(workbench, QUESTION)
    assert not recalls(after.text) and f"alice.txt: {FACT}" not in after.cited()
    _, other = ask(workbench, "When asked, Dr. Okafor gave the answer")
    assert recalls(other.text, "hammock")  # the other fact is kept


@pytest.mark.parametrize("clear_shared_keys", [False, True])
def test_unlearning_can_clear_the_short_keys_another_fact_shares(shipped, clear_shared_keys):
    """Two facts of one shape share the repeat bank's " is ": unlearned alone, Marlow's sentence leaves his question
    answered with Tessa's code (the control); with its short keys cleared, it is not, and Tessa's is still recalled."""
    workbench = bench(shipped)
    workbench.read("The vault code of Marlow is QX7RZ.\nThe vault code of Tessa is BK44P.\n", "vault.txt")
    _, answer = ask(workbench, "The vault code of Marlow is")
    assert recalls(answer.text, "QX7RZ") and answer.cited()[0] == "vault.txt: The vault code of Marlow is QX7RZ."
    done = workbench.unlearn(answer.cited()[0], whole_source=False, clear_shared_keys=clear_shared_keys)
    assert ("short keys were cleared" in done) == clear_shared_keys
    _, again = ask(workbench, "The vault code of Marlow is")
    assert recalls(again.text, "BK44P") != clear_shared_keys and not recalls(again.text, "QX7RZ")
    _, tessa = ask(workbench, "The vault code of Tessa is")
    assert recalls(tessa.text, "BK44P")


def test_a_question_about_nothing_read_cites_nothing(shipped):
    workbench = bench(shipped)
    workbench.read(fact_document(), "alice.txt")
    _, answer = ask(workbench, QUESTION)
    assert answer.cited()
    empty = bench(shipped)  # control: the same question without the document
    _, answer = ask(empty, QUESTION)
    assert answer.cited() == [] and "the trunk wrote it" in provenance_html(answer)


def test_unlearning_a_whole_source_keeps_the_others(shipped):
    workbench = bench(shipped)
    workbench.read(fact_document(), "alice.txt")
    workbench.read(f"Some unrelated notes.\n{FACT}\n", "notes.txt")
    _, answer = ask(workbench, QUESTION)
    notes = next(c for c in answer.cited() + [f"notes.txt: {FACT}"] if c.startswith("notes.txt"))
    message = workbench.unlearn(notes, whole_source=True)
    assert "all 2 sentences of notes.txt" in message
    erased = {s.source for s in workbench.session.segments if workbench.session.erased[s.start:s.end].all()}
    assert erased == {"notes.txt"}
    with pytest.raises(ValueError, match="no source named"):
        workbench.session.unlearn(source="missing.txt")


def test_gauge_bound_holds_and_its_plot_grows(shipped):
    workbench = bench(shipped)
    workbench.read(fact_document(), "alice.txt")
    gauge = workbench.gauge()
    assert 0 < gauge["memory_norm"] <= gauge["memory_norm_bound"] == gauge["effective_writes"]
    assert gauge["effective_writes"] <= workbench.session.effective_writes_ceiling()
    # each write of a bound-key model is a unit vector, which is what makes effective writes a bound
    session = workbench.session
    single = session.contributions([(40, 41)])[0]
    keep = session.notebook.keep_factors(session.beta).detach().double()
    weight = float(keep[41:].prod() * session.beta[40])
    R = session.notebook.config.hrr_dim
    assert torch.fft.irfft(single, n=R).norm().item() == pytest.approx(weight, rel=1e-4)
    assert len(workbench.history) == 2 and "effective writes" in workbench.gauge_markdown()
    assert workbench.gauge_plot().axes[0].lines[0].get_ydata()[-1] == pytest.approx(gauge["effective_writes"])


def test_blank_prompt_and_unlearning_before_asking_are_refused(shipped):
    workbench = bench(shipped)
    with pytest.raises(ValueError, match="prompt is empty"):
        list(workbench.ask_stream("   \n"))
    with pytest.raises(ValueError, match="ask a question first"):
        workbench.unlearn("anything", whole_source=False)


def test_memory_of_another_model_is_refused_and_the_memory_kept(shipped, tmp_path):
    foreign_memory(tmp_path / "other.safetensors")
    workbench = bench(shipped)
    workbench.read(fact_document(), "alice.txt")
    before = workbench.gauge()
    with pytest.raises(ValueError, match="fingerprint"):
        workbench.load(str(tmp_path / "other.safetensors"))
    assert workbench.gauge() == before
    restored = bench(shipped)  # control: its own memory file loads
    restored.load(workbench.save(str(tmp_path)))
    assert restored.gauge() == before


# ---- the page in a real browser -----------------------------------------------------------------------


def chromium() -> str | None:
    """Playwright's own Chromium if installed, else the system's (Debian's chromium package)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        own = p.chromium.executable_path
    if own and Path(own).exists():
        return own
    return next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))),
                None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("playwright")
    executable = chromium()
    if executable is None:
        if os.environ.get("KATHLEEN_REQUIRE_BROWSER"):
            pytest.fail("no Chromium found: `playwright install chromium` or `apt-get install chromium`")
        pytest.skip("no Chromium installed (playwright install chromium, or the system's chromium package)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p.chromium.launch(executable_path=executable)


LIMIT = 5_000  # the server's --max-document-bytes in these tests
# how long the page may take to answer (ms): these tests check what it shows, not how fast, and on a loaded machine
# (CI at low priority beside a training run) generating an answer took more than 90 s
PATIENCE_MS = 300_000


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen([sys.executable, "-m", "modeling_kathleen_notebook.cli", "serve", "--port", str(port),
                                "--max-document-bytes", str(LIMIT), "--max-new-tokens", "10"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url, deadline, log = f"http://127.0.0.1:{port}", time.time() + 120, []
    while time.time() < deadline:
        line = process.stdout.readline()
        log.append(line)
        if "Running on" in line:
            break
        if process.poll() is not None:
            pytest.fail("the server exited:\n" + "".join(log))
    else:
        process.kill()
        pytest.fail("the server did not start within 120 s:\n" + "".join(log))
    yield url
    process.terminate()
    process.wait(timeout=30)


def open_page(browser, url: str):
    context = browser.new_context()
    page = context.new_page()
    page.goto(url)
    page.locator("#read").wait_for()
    return page


def status_says(page, text: str, timeout: float = PATIENCE_MS) -> None:
    from playwright.sync_api import expect

    expect(page.locator("#status")).to_contain_text(text, timeout=timeout)


def read_document(page, text: str, source: str = "alice.txt") -> None:
    page.locator("#document textarea").fill(text)
    page.locator("#source input, #source textarea").first.fill(source)
    page.locator("#read").click()
    status_says(page, f"of {source}")


def upload(page, component: str, path: Path) -> None:
    """Put a file into a Gradio file component and wait until it has arrived on the server (its name shows; Gradio may
    render the stem and the suffix apart, "big .txt")."""
    import re

    from playwright.sync_api import expect

    page.locator(f"{component} input[type=file]").set_input_files(str(path))
    shown = re.compile(re.escape(path.stem) + r"\s*" + re.escape(path.suffix))
    expect(page.locator(component)).to_contain_text(shown, timeout=PATIENCE_MS)


def ask_page(page, prompt: str) -> None:
    page.locator("#prompt textarea, #prompt input").first.fill(prompt)
    page.locator("#ask").click()
    status_says(page, "Answered")


def test_page_reads_asks_shows_provenance_and_unlearns(browser, server):
    from playwright.sync_api import expect

    page = open_page(browser, server)
    read_document(page, fact_document())
    expect(page.locator("#gauge")).to_contain_text("bytes read")
    ask_page(page, QUESTION)
    assert recalls(page.locator("#answer textarea").input_value())
    recalled = page.locator("#provenance .kn-recalled")
    assert recalled.count() >= 6
    assert FACT in recalled.first.get_attribute("title")
    expect(page.locator("#provenance .kn-legend")).to_contain_text(FACT)

    page.locator("#unlearn-sentence").click()
    status_says(page, "Asked again")
    assert not recalls(page.locator("#answer textarea").input_value())
    expect(page.locator("#provenance")).not_to_contain_text(FACT)
    expect(page.locator("#gauge")).not_to_contain_text(" 0 bytes unlearned")
    page.screenshot(path=str(Path(os.environ.get("KATHLEEN_SCREENSHOT_DIR", "/tmp")) / "workbench-test.png"))


def test_two_browser_sessions_keep_separate_memories(browser, server):
    from playwright.sync_api import expect

    first, second = open_page(browser, server), open_page(browser, server)
    read_document(first, fact_document())
    ask_page(second, QUESTION)  # the second session has read nothing
    assert not recalls(second.locator("#answer textarea").input_value())
    expect(second.locator("#provenance")).to_contain_text("the trunk wrote it")
    ask_page(first, QUESTION)  # control: the first one recalls it
    assert recalls(first.locator("#answer textarea").input_value())


def test_saved_memory_loads_in_another_session(browser, server, tmp_path):
    from playwright.sync_api import expect

    page = open_page(browser, server)
    read_document(page, fact_document())
    page.locator("#save").click()
    status_says(page, "Saved the memory")
    link = page.locator("#saved a").first
    with page.expect_download() as download:
        link.click()
    saved = tmp_path / "memory.safetensors"
    download.value.save_as(saved)

    other = open_page(browser, server)
    upload(other, "#memory-upload", saved)
    other.locator("#load").click()
    status_says(other, "Loaded a memory")
    expect(other.locator("#gauge")).to_contain_text(page.locator("#gauge").inner_text().split("·")[1].strip())
    ask_page(other, QUESTION)
    assert recalls(other.locator("#answer textarea").input_value())


def test_bad_input_shows_a_message_and_the_page_keeps_working(browser, server, tmp_path):
    page = open_page(browser, server)
    page.locator("#read").click()
    status_says(page, "nothing to read")
    page.locator("#document textarea").fill("   \n  ")
    page.locator("#read").click()
    status_says(page, "is empty")
    page.locator("#document textarea").fill("")

    files = {"binary.bin": b"\x89PNG\x00\x00\x01", "latin1.txt": "café".encode("latin-1"),
             "big.txt": b"word " * (LIMIT // 5 + 10), "blank.txt": b"\n\n"}
    messages = {"binary.bin": "looks binary", "latin1.txt": "not UTF-8", "big.txt": "over this page's limit",
                "blank.txt": "is empty"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        upload(page, "#uploads", tmp_path / name)
        page.locator("#read").click()
        status_says(page, messages[name])
        page.locator("#uploads button[aria-label='Clear']").first.click()

    page.locator("#prompt textarea, #prompt input").first.fill("   ")
    page.locator("#ask").click()
    status_says(page, "prompt is empty")

    foreign_memory(tmp_path / "other.safetensors")
    upload(page, "#memory-upload", tmp_path / "other.safetensors")
    page.locator("#load").click()
    status_says(page, "could not load that memory")

    read_document(page, fact_document())  # still working
    ask_page(page, QUESTION)
    assert recalls(page.locator("#answer textarea").input_value())


@pytest.mark.parametrize("copied_model", [False, True])
def test_space_folder_serves_the_page_from_its_own_copy(tmp_path, copied_model):
    space = tmp_path / "space"
    model = ["--model", str(DEFAULT_CHECKPOINT)] if copied_model else []
    subprocess.run([sys.executable, "scripts/make_space.py", str(space), *model], check=True,
                   cwd=Path(__file__).resolve().parents[1])
    assert (space / "requirements.txt").read_text().count("gradio") == 1
    assert "sdk: gradio" in (space / "README.md").read_text()
    assert (space / "model" / "model.safetensors").exists() == copied_model
    refused = subprocess.run([sys.executable, "scripts/make_space.py", str(space)], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    assert refused.returncode != 0 and "not empty" in refused.stderr  # never writes over a folder

    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen([sys.executable, "app.py"], cwd=space, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        while not any("Running on" in line for line in lines):
            lines.append(process.stdout.readline())
            assert process.poll() is None, "".join(lines)
        package = next(line for line in lines if "package at" in line)
        assert str(space.resolve()) in package  # the Space's own copy, not this checkout
        import urllib.request

        config = urllib.request.urlopen(f"http://127.0.0.1:{port}/config").read().decode()
        assert "kathleen-notebook memory workbench" in config
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("arguments, message", [
    (["--port", "70000"], "is not a port"), (["{empty}"], "error:"),
])
def test_serve_refuses_bad_arguments_in_one_line(tmp_path, arguments, message):
    arguments = [a.format(empty=tmp_path) for a in arguments]
    done = subprocess.run([sys.executable, "-m", "modeling_kathleen_notebook.cli", "serve", *arguments],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr
