"""`kathleen-notebook serve`: the memory workbench, a Gradio page (the one a Hugging Face Space would show).

Read documents into a notebook memory, ask, see which source sentence each recalled byte came from, unlearn
a sentence or a whole source and ask again, watch the memory fill, save it and load it back. Each browser
session has its own `NotebookSession` over one shared, read-only model, so two users never see each
other's memory. Bad input (an empty or binary document, a file over the size limit, a blank prompt, a
memory file of another model) leaves a message on the page and the memory as it was.

The page logic is plain Python (`Workbench`, `provenance_html`, `document_text`), tested without a browser;
`build_app` only lays it out. Gradio is an optional extra: pip install "kathleen-notebook[app]".
"""

from __future__ import annotations

import html
import queue
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .session import ByteAttribution, NotebookSession
from .tokenization_kathleen import ids_to_bytes

# per document or upload (the page says so): reading costs O(bytes x R), minutes for 100 KB at the shipped R
MAX_DOCUMENT_BYTES = 100_000
MIN_DROP = 1.0  # nats: a byte counts as recalled from a sentence when erasing it would lower the byte's logit this much
# a colour per cited sentence, in order of first citation (colour-blind-safe, light enough for black text)
PALETTE = ["#ffd27f", "#9fd3ff", "#b9f0a6", "#f7b2d9", "#d6c2ff", "#ffb8a3", "#a8f0e6", "#e8e39a"]


def document_text(data: bytes, name: str, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """The text of an uploaded or pasted document, or `ValueError` saying why it cannot be read."""
    if len(data) > limit:
        raise ValueError(f"{name} is {len(data):,} bytes, over this page's limit of {limit:,} bytes")
    if b"\x00" in data:
        raise ValueError(f"{name} looks binary (it contains NUL bytes): upload a text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{name} is not UTF-8 text (byte {error.start}): upload a text file") from None
    if not text.strip():
        raise ValueError(f"{name} is empty: there is nothing to read")
    return text


@dataclass
class Answer:
    """One question and the model's answer, with the attribution of every answer byte."""

    prompt: str
    ids: torch.Tensor
    attributions: list[ByteAttribution] = field(default_factory=list)

    @property
    def text(self) -> str:
        return ids_to_bytes(self.ids).decode("utf-8", "replace")

    def cited(self) -> list[str]:
        """The sentences this answer recalled from, first cited first (each as 'source: sentence')."""
        names = [label(a.sources[0][0]) for a in self.attributions if from_memory(a)]
        return list(dict.fromkeys(names))


def from_memory(item: ByteAttribution) -> bool:
    """Whether the notebook's contribution to this byte came from one sentence: erasing it costs >= MIN_DROP."""
    return bool(item.sources) and item.sources[0][1] >= MIN_DROP


def label(segment) -> str:
    return f"{segment.source}: {segment.text}"


def characters(attributions: list[ByteAttribution], ids: torch.Tensor) -> list[tuple[str, ByteAttribution]]:
    """Group answer bytes into UTF-8 characters; a character carries the attribution of its most-cited byte."""
    data, out, start = ids_to_bytes(ids), [], 0
    while start < len(data):
        width = next((w for w in range(1, 5) if start + w <= len(data) and _decodes(data[start:start + w])), 1)
        group = attributions[start:start + width]
        best = max(group, key=lambda a: a.sources[0][1] if a.sources else float("-inf"))
        out.append((data[start:start + width].decode("utf-8", "replace"), best))
        start += width
    return out


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def provenance_html(answer: Answer) -> str:
    """The answer with every recalled character highlighted in the colour of its source sentence (hover: trunk
    vs notebook logit and the counterfactual drop), characters the trunk produced alone left plain, and a
    legend of the cited sentences."""
    cited = answer.cited()
    colour = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(cited)}
    spans = []
    for text, item in characters(answer.attributions, answer.ids):
        shown = html.escape(text).replace("\n", "<br>")
        logits = f"trunk logit {item.trunk_logit:+.2f}, notebook logit {item.memory_logit:+.2f}"
        if from_memory(item):
            segment, drop = item.sources[0]
            name = label(segment)
            tip = f"{logits}; from {name!r}; erasing it lowers this byte's logit by {drop:.2f}"
            spans.append(f'<span class="kn-recalled" data-sentence="{cited.index(name)}" '
                         f'style="background:{colour[name]}" title="{html.escape(tip)}">{shown}</span>')
        else:
            spans.append(f'<span class="kn-trunk" title="{html.escape(logits + "; the trunk alone")}">{shown}</span>')
    legend = "".join(f'<li class="kn-source" data-sentence="{i}"><span style="background:{colour[name]}">'
                     f"&nbsp;&nbsp;&nbsp;</span> {html.escape(name)}</li>" for i, name in enumerate(cited))
    legend = (f'<ul class="kn-legend">{legend}</ul>' if cited
              else '<p class="kn-legend">No byte of this answer came from a sentence in memory: '
                   'the trunk wrote it.</p>')
    return (f'<div class="kn-provenance"><p><b>{html.escape(answer.prompt)}</b>'
            f'<span class="kn-answer">{"".join(spans)}</span></p>{legend}</div>')


class Workbench:
    """One browser session's memory: read, ask (streamed), attribute, unlearn, gauge, save and load."""

    def __init__(self, session: NotebookSession, max_new_tokens: int = 48):
        self.session = session
        self.max_new_tokens = max_new_tokens
        self.history: list[dict] = [self.gauge()]
        self.last: Answer | None = None

    def read(self, text: str, source: str) -> str:
        segments = self.session.read(text, source=source)
        self.history.append(self.gauge())
        return f"Read {len(text.encode('utf-8')):,} bytes of {source} ({len(segments)} sentences) into memory."

    def ask_stream(self, prompt: str) -> Iterator[str]:
        """The answer's text so far, byte by byte as generated; then `self.last` holds it with its attribution."""
        if not prompt.strip():
            raise ValueError("the prompt is empty: type a question or the start of a sentence")
        updates: queue.Queue = queue.Queue()
        streamer = _QueueStreamer(updates)
        result: dict = {}

        def generate() -> None:
            try:
                result["ids"] = self.session.ask(prompt, max_new_tokens=self.max_new_tokens, streamer=streamer)
            except Exception as error:  # re-raised in the caller's thread
                result["error"] = error
            finally:
                updates.put(None)

        threading.Thread(target=generate, daemon=True).start()
        generated = bytearray()
        while (piece := updates.get()) is not None:
            generated.extend(piece)
            yield generated.decode("utf-8", "ignore")  # a character split across bytes shows once complete
        if "error" in result:
            raise result["error"]
        self.last = Answer(prompt, result["ids"], self.session.attribute(prompt, result["ids"], top=1))

    def unlearn(self, choice: str, whole_source: bool, clear_shared_keys: bool = False) -> str:
        """Erase a cited sentence ('source: sentence', as in `Answer.cited`) or every sentence of its source;
        clear_shared_keys as `NotebookSession.unlearn`'s."""
        if self.last is None:
            raise ValueError("ask a question first: unlearning answers it again")
        match = next((s for s in self.session.segments if label(s) == choice), None)
        if match is None:
            raise ValueError("choose a sentence the last answer recalled from")
        if whole_source:
            spans = self.session.unlearn(source=match.source, clear_shared_keys=clear_shared_keys)
            done = f"Unlearned all {len(spans)} sentences of {match.source}."
        else:
            self.session.unlearn(span=(match.start, match.end), clear_shared_keys=clear_shared_keys)
            done = f"Unlearned {match.text!r}."
        if clear_shared_keys and self.session.notebook.config.repeat_key_window:
            done += " Its short keys were cleared from the repeat bank."
        self.history.append(self.gauge())
        return done

    def gauge(self) -> dict:
        return self.session.summary()

    def gauge_markdown(self) -> str:
        g = self.history[-1]  # taken after every read, unlearning and load
        ceiling = self.session.effective_writes_ceiling()
        return (f"**Memory** · {g['bytes_read']:,} bytes read · {g['segments']:,} sentences · write mass "
                f"{g['write_mass']:,.1f} · effective writes {g['effective_writes']:,.1f}"
                + (f" (ceiling {ceiling:,.0f} under forgetting)" if ceiling is not None else "")
                + f" · norm {g['memory_norm']:,.2f}"
                + (f" ≤ bound {g['memory_norm_bound']:,.1f}" if g.get("memory_norm_bound") is not None else "")
                + f" · {g['erased_positions']:,} bytes unlearned")

    def gauge_plot(self):
        """How the memory grew: effective writes and norm after each read or unlearning (matplotlib figure)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(5, 2.4), layout="constrained")
        steps = range(len(self.history))
        axes.plot(steps, [h["effective_writes"] for h in self.history], marker="o", label="effective writes")
        axes.plot(steps, [h["memory_norm"] for h in self.history], marker="s", label="norm")
        axes.set_xlabel("reads and unlearnings")
        axes.set_xticks(list(steps))
        figure.legend(loc="outside upper center", ncols=2, fontsize=8)
        plt.close(figure)
        return figure

    def save(self, folder: str) -> str:
        path = str(Path(folder) / "memory.safetensors")
        self.session.save(path)
        return path

    def load(self, path: str) -> str:
        self.session.load(path)  # checks everything first: a foreign file leaves the memory as it was
        self.history.append(self.gauge())
        self.last = None
        return f"Loaded a memory of {self.gauge()['bytes_read']:,} bytes from {Path(path).name}."


class _QueueStreamer:
    """A `generate` streamer (transformers' put / end protocol) that queues each new byte; skips the prompt."""

    def __init__(self, updates: queue.Queue):
        self.updates, self.prompt_seen = updates, False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.updates.put(ids_to_bytes(value.flatten()))

    def end(self) -> None:
        pass


def build_app(model_path: str | None = None, max_document_bytes: int = MAX_DOCUMENT_BYTES,
              max_new_tokens: int = 48):
    """The Gradio Blocks of the workbench over one model (default: the shipped checkpoint)."""
    try:
        import gradio as gr
    except ImportError:
        raise ImportError('the workbench needs Gradio: pip install "kathleen-notebook[app]"') from None
    from .session import DEFAULT_CHECKPOINT

    shared = NotebookSession.from_pretrained(str(model_path or DEFAULT_CHECKPOINT))
    model, path = shared.model, shared.model_path
    files = tempfile.mkdtemp(prefix="kathleen-workbench-")

    def bench_of(bench: Workbench | None) -> Workbench:
        return bench or Workbench(NotebookSession(model, model_path=path), max_new_tokens)

    # Gradio finds its progress tracker in a default argument; track_tqdm shows NotebookSession.read's bar
    def read(bench, pasted, uploads, source, progress=gr.Progress(track_tqdm=True)):  # noqa: B008
        bench = bench_of(bench)
        try:
            documents = [(document_text(pasted.encode("utf-8"), "the pasted text", max_document_bytes),
                          source.strip() or "pasted text")] if pasted else []
            for upload in uploads or []:
                name = Path(upload).name
                size = Path(upload).stat().st_size
                if size > max_document_bytes:  # before reading it into memory
                    raise ValueError(f"{name} is {size:,} bytes, over this page's limit of {max_document_bytes:,}")
                documents.append((document_text(Path(upload).read_bytes(), name, max_document_bytes), name))
            if not documents:
                raise ValueError("nothing to read: paste a text or upload a text file")
            said = []
            for i, (text, name) in enumerate(documents):
                progress((i, len(documents)), desc=f"reading {name}")
                said.append(bench.read(text, name))
            message = " ".join(said)
        except ValueError as error:
            message = f"⚠️ {error}"
        return bench, message, bench.gauge_markdown(), bench.gauge_plot()

    def answer_outputs(answer: Answer) -> tuple:
        """The answer box, its provenance view and the choice of cited sentences."""
        cited = answer.cited()
        return answer.text, provenance_html(answer), gr.update(choices=cited, value=cited[0] if cited else None)

    def ask(bench, prompt):
        bench = bench_of(bench)
        try:
            for text in bench.ask_stream(prompt):
                yield bench, "Generating…", text, "", gr.update()
            cited = len(bench.last.cited())
            yield bench, f"Answered; {cited} sentence(s) in memory cited.", *answer_outputs(bench.last)
        except ValueError as error:
            yield bench, f"⚠️ {error}", "", "", gr.update()

    def unlearn(bench, choice, whole_source, clear_shared_keys):
        bench = bench_of(bench)
        try:
            done = bench.unlearn(choice or "", whole_source, bool(clear_shared_keys))
            prompt = bench.last.prompt
            for _ in bench.ask_stream(prompt):
                pass
            return (bench, f"{done} Asked again: {prompt!r}", *answer_outputs(bench.last), bench.gauge_markdown(),
                    bench.gauge_plot())
        except ValueError as error:
            return bench, f"⚠️ {error}", gr.update(), gr.update(), gr.update(), gr.update(), gr.update()

    def save(bench):
        bench = bench_of(bench)
        folder = tempfile.mkdtemp(dir=files)
        return bench, f"Saved the memory ({bench.gauge()['bytes_read']:,} bytes read).", bench.save(folder)

    def load(bench, upload):
        bench = bench_of(bench)
        try:
            if not upload:
                raise ValueError("choose a memory file to load")
            message = bench.load(upload)
        except ValueError as error:
            message = f"⚠️ could not load that memory: {error}"
        return bench, message, bench.gauge_markdown(), bench.gauge_plot()

    config = model.config
    with gr.Blocks(title="kathleen-notebook memory workbench") as app:
        bench = gr.State(None)  # this browser session's Workbench, made when the page loads
        app.load(bench_of, [bench], [bench])
        model_name = Path(path).name if Path(path).exists() else path  # a folder's name, not this machine's layout
        gr.Markdown(f"# Memory workbench\n`{model_name}`: a byte-level model with a notebook memory "
                    f"(R = {config.hrr_dim:,}). Read documents, ask, see where each recalled byte came from, "
                    f"unlearn. Your memory is yours alone; it lives as long as this page.")
        status = gr.Markdown("The memory is empty: paste or upload a document and read it.", elem_id="status")
        with gr.Row():
            with gr.Column():
                pasted = gr.Textbox(label="Document", lines=8, placeholder="Paste text to remember",
                                    elem_id="document")
                uploads = gr.File(label=f"or upload text files (at most {max_document_bytes:,} bytes each)",
                                  file_count="multiple", type="filepath", elem_id="uploads")
                source = gr.Textbox(label="Source name of the pasted text", value="pasted text", elem_id="source")
                read_button = gr.Button("Read into memory", variant="primary", elem_id="read")
            with gr.Column():
                gauge = gr.Markdown("**Memory** · empty", elem_id="gauge")
                plot = gr.Plot(label="How the memory grew", elem_id="plot")
                save_button = gr.Button("Save memory", elem_id="save")
                saved = gr.File(label="Memory file", interactive=False, elem_id="saved")
                memory_upload = gr.File(label="Load a memory file", type="filepath", elem_id="memory-upload")
                load_button = gr.Button("Load memory", elem_id="load")
        prompt = gr.Textbox(label="Ask or continue", placeholder="The capital of Freedonia is", elem_id="prompt")
        ask_button = gr.Button("Ask", variant="primary", elem_id="ask")
        answer = gr.Textbox(label="Answer (streamed)", interactive=False, elem_id="answer")
        provenance = gr.HTML(elem_id="provenance")
        with gr.Row():
            cited = gr.Dropdown(label="A sentence the answer recalled from", choices=[], elem_id="cited")
            unlearn_sentence = gr.Button("Unlearn this sentence", elem_id="unlearn-sentence")
            unlearn_source = gr.Button("Unlearn its whole source", elem_id="unlearn-source")
        # a repeat bank's 4-byte keys are shared by sentences that end alike: clearing them costs the others recall
        clear_keys = gr.Checkbox(label="Also clear its short keys from the repeat bank (then no other sentence "
                                 "answers its question there; the others lose some recall)", value=False,
                                 visible=bool(config.memory == "notebook" and config.repeat_key_window),
                                 elem_id="clear-shared-keys")

        gauge_outputs = [bench, status, gauge, plot]
        read_button.click(read, [bench, pasted, uploads, source], gauge_outputs)
        ask_button.click(ask, [bench, prompt], [bench, status, answer, provenance, cited])
        prompt.submit(ask, [bench, prompt], [bench, status, answer, provenance, cited])
        unlearn_outputs = [bench, status, answer, provenance, cited, gauge, plot]
        unlearn_sentence.click(lambda b, c, k: unlearn(b, c, False, k), [bench, cited, clear_keys], unlearn_outputs)
        unlearn_source.click(lambda b, c, k: unlearn(b, c, True, k), [bench, cited, clear_keys], unlearn_outputs)
        save_button.click(save, [bench], [bench, status, saved])
        load_button.click(load, [bench, memory_upload], gauge_outputs)
    app.queue(default_concurrency_limit=1)  # one shared model on a CPU: requests take turns
    return app
