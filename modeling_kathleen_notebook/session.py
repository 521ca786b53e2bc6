"""`NotebookSession`: a memory you can keep, edit and audit (SPEC §3, "Memory operations").

A session is a model, its `KathleenCache` and a record of everything the notebook read: the token
ids, the write strength β of every position, and named segments (sentences, documents, facts).
Because the notebook is linear in its writes, that record is enough to recompute exactly what any
span contributed to the memory, including every forgetting factor applied after it:

    C_S = Σ_{u in S} D_u β_u w_u,   D_u = Π_{v > u} (1 - g β_v),   w_u = key_{u-1} ⊛ cv[x_u]

so a fact is unlearned by one subtraction, and the source of a recalled byte is the segment whose
removal would lower that byte's logit most. A repeat bank (config.repeat_key_window) is written with the
same β and forgetting under shorter keys, so the same record gives its contributions too: unlearning
subtracts from both memories and attribution counts both reads (`Notebook.banks`). A short key is shared by
every sentence that ends in the same few bytes; `NotebookSession.unlearn(..., clear_shared_keys=True)` also takes
out of the repeat bank whatever other positions wrote under the fact's keys. Nothing here retrains anything.

    session = NotebookSession.from_pretrained("my-model")
    session.read(open("notes.txt").read(), source="notes.txt")
    print(session.ask("The capital of Freedonia is", max_new_tokens=20))
    session.unlearn(text="The capital of Freedonia is Fredville.")
    session.save("notes.memory.safetensors")
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .cache import KathleenCache, read_safetensors, save_safetensors
from .configuration_kathleen import BYTE_OFFSET, PAD_ID
from .modeling_kathleen import KathleenForCausalLM
from .record import grouped_writes, preceding_windows, span_contributions, survival, trace
from .scan_read import PIECE_ELEMENTS
from .tokenization_kathleen import bytes_to_ids, ids_to_bytes
from .trunk import TrunkState

logger = logging.getLogger(__name__)
PACKAGE_DATA = Path(__file__).resolve().parent / "pretrained"
DEFAULT_CHECKPOINT = PACKAGE_DATA / "kathleen-notebook-0.5m"  # the shipped model
# version 2 added the repeat bank's cleared positions; a version 1 file has none and loads as such
SESSION_FORMAT, SESSION_VERSION, READABLE_VERSIONS = "kathleen-notebook-session", "2", ("1", "2")
MEMORY_FILE = "memory.safetensors"  # the file of a memory folder or Hub repository
# a sentence ends at . ! or ? and white space, except after a title or an initial ("Dr. Okafor", "J. Smith"), or at
# a line break
TITLES = (b"Dr", b"Mr", b"Mrs", b"Ms", b"Prof", b"St", b"Jr", b"Sr", b"Capt", b"Col", b"Gen", b"Lt", b"Sgt", b"vs")
SENTENCE_END = re.compile(rb"(?<=[.!?])(?<!\b[A-Z]\.)" + b"".join(rb"(?<!\b" + t + rb"\.)" for t in TITLES)
                          + rb"\s+|\n+")


@dataclass
class Segment:
    """A named span [start, end) of the positions the notebook has read."""

    source: str
    start: int
    end: int
    text: str


@dataclass
class ByteAttribution:
    """Why the model emitted one byte: the logit split and the segments whose erasure would cost most."""

    byte: str
    trunk_logit: float
    memory_logit: float
    recalled: bool  # the notebook's own top choice is this byte
    sources: list[tuple[Segment, float]]  # (segment, drop of this byte's logit if it were erased), largest first


def as_ids(data: str | bytes | torch.Tensor) -> torch.Tensor:
    """Token ids [T] of text, bytes or ids. Anything else is a TypeError (`bytes(12)` would be twelve zero bytes)."""
    if isinstance(data, torch.Tensor):
        return data.flatten().long()
    if isinstance(data, str):
        return bytes_to_ids(data.encode("utf-8"))
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes_to_ids(bytes(data))
    raise TypeError(f"expected text (str), bytes or a tensor of token ids, got {type(data).__name__}")


class NotebookSession:
    """A notebook model with a persistent, editable, auditable memory (see the module docstring)."""

    def __init__(self, model: KathleenForCausalLM, model_path: str | None = None):
        if not isinstance(model, KathleenForCausalLM):  # the adapter's cache holds another model's state too
            raise ValueError(f"a NotebookSession needs a KathleenForCausalLM, got {type(model).__name__}")
        if model.config.memory != "notebook":
            raise ValueError(f"a NotebookSession needs a notebook model, this one has memory={model.config.memory!r}")
        if model.config.fact_bank:
            raise ValueError("a NotebookSession's record (unlearning, attribution) does not cover a fact bank yet")
        self.model = model.eval()
        self.model_path = model_path
        self.cache = KathleenCache(model.config)
        self.ids = torch.zeros(0, dtype=torch.long)  # every position read, padding as the pad id
        self.beta = torch.zeros(0)  # β at every position (0 where nothing was written)
        self.erased = torch.zeros(0, dtype=torch.bool)  # positions whose writes were unlearned from every memory
        self.repeat_cleared = torch.zeros(0, dtype=torch.bool)  # ... from the repeat bank only (shared short keys)
        self.segments: list[Segment] = []

    @classmethod
    def from_pretrained(cls, path: str, **kwargs) -> NotebookSession:
        # a folder is recorded absolute, so that the memory file finds its model from any working directory
        recorded = str(Path(path).resolve()) if Path(path).is_dir() else str(path)
        return cls(KathleenForCausalLM.from_pretrained(path, **kwargs), model_path=recorded)

    @property
    def notebook(self):
        return self.model.model.memory

    # ---- reading and asking ----------------------------------------------------------------------

    @torch.no_grad()
    def read(
        self,
        data: str | bytes | torch.Tensor,
        source: str = "text",
        write_mask: torch.Tensor | None = None,
        segments: list[tuple[int, int]] | None = None,
        chunk_size: int = 4096,
        progress: bool | None = None,
    ) -> list[Segment]:
        """Read text into memory without generating. Segments default to its sentences; `segments`
        gives (start, end) offsets within `data` instead. `write_mask` [T] replaces the gate's β.
        A progress bar shows for texts of more than four chunks unless `progress` says otherwise."""
        from tqdm.auto import tqdm

        ids = as_ids(data)
        if ids.numel() == 0:
            raise ValueError("nothing to read: the text is empty")
        offset = len(self.ids)
        show = progress if progress is not None else len(ids) > 4 * chunk_size
        beta = []
        for start in tqdm(range(0, len(ids), chunk_size), desc=f"reading {source}", unit="chunk", disable=not show):
            chunk = ids[start:start + chunk_size].unsqueeze(0)
            mask = None if write_mask is None else write_mask[start:start + chunk_size].unsqueeze(0)
            out = self.model(chunk, cache=self.cache, write_mask=mask, use_cache=True, logits_to_keep=1,  # no reads
                             output_write_strengths=True)
            beta.append(out.write_strengths[0].float())
        self.extend_record(ids, torch.cat(beta))
        spans = segments if segments is not None else sentence_spans(ids_to_bytes(ids))
        added = [Segment(source, offset + a, offset + b, ids_to_bytes(ids[a:b]).decode("utf-8", "replace"))
                 for a, b in spans]
        self.segments.extend(added)
        return added

    def ask(self, prompt: str | bytes | torch.Tensor, **generate_kwargs) -> torch.Tensor:
        """Generate a continuation of `prompt` with the memory so far. Asking leaves the memory as it
        was (use `read` to remember something). Returns the new token ids [N]."""
        prompt_ids = as_ids(prompt).unsqueeze(0)
        cache = copy.deepcopy(self.cache)
        cache.seen_tokens = 0  # generate then feeds the whole prompt, not "the part not yet seen"
        generate_kwargs.setdefault("max_new_tokens", 64)
        generate_kwargs.setdefault("do_sample", False)
        out = self.model.generate(prompt_ids, cache=cache if not cache.is_empty() else None, **generate_kwargs)
        return out[0, prompt_ids.shape[1]:]

    def ask_text(self, prompt: str, **generate_kwargs) -> str:
        return ids_to_bytes(self.ask(prompt, **generate_kwargs)).decode("utf-8", "replace")

    def forget_trunk(self) -> None:
        """Keep the notebook, drop the trunk's fading state and the byte context: the next text starts a
        new conversation that still has every stored fact."""
        if self.cache.is_empty():
            return
        self.cache.trunk = [TrunkState(torch.zeros_like(s.integrator), torch.zeros_like(s.conv_tail))
                            for s in self.cache.trunk]
        tail = torch.full_like(self.cache.memory.tail, PAD_ID)
        state = self.cache.memory
        self.cache.memory = dataclasses.replace(state, tail=tail, last_logits=torch.zeros_like(state.last_logits))
        # in the record, a break is a run of padding: no writes, no forgetting, an empty key window
        n = tail.shape[1]
        self.extend_record(torch.full((n,), PAD_ID), torch.zeros(n))

    def extend_record(self, ids: torch.Tensor, beta: torch.Tensor) -> None:
        """Append positions (their ids and β) to the record, none of them erased."""
        self.ids = torch.cat([self.ids, ids])
        self.beta = torch.cat([self.beta, beta])
        self.erased = torch.cat([self.erased, torch.zeros(len(ids), dtype=torch.bool)])
        self.repeat_cleared = torch.cat([self.repeat_cleared, torch.zeros(len(ids), dtype=torch.bool)])

    # ---- exact contributions -----------------------------------------------------------------------

    def contributions(self, spans: list[tuple[int, int]], chunk_size: int | None = None,
                      bank: int = 0) -> torch.Tensor:
        """What each span [start, end) of the record adds to a memory now: [len(spans), F] complex (record.py).
        `bank` indexes `notebook.banks()`: 0 the first memory, 1 the repeat bank."""
        weight = (self.surviving_writes() * self.live(bank)).float()
        tables = self.notebook.banks()[bank].tables
        return span_contributions(self.notebook, self.ids, weight, spans, chunk_size, tables)

    def surviving_writes(self) -> torch.Tensor:
        """D_u β_u [T]: how much of each position's write is left in the memory now (before any unlearning)."""
        return survival(self.notebook.keep_factors(self.beta)) * self.beta

    def live(self, bank: int = 0) -> torch.Tensor:
        """[T] bool: the positions whose writes are still in memory `bank` (not unlearned, not cleared from it)."""
        return ~self.erased & ~self.repeat_cleared if bank == 1 else ~self.erased

    def shared_key_positions(self, spans: list[tuple[int, int]]) -> torch.Tensor:
        """The positions outside `spans`, still in the repeat bank, that wrote under a key some position of the spans
        wrote under (the W' ids before it): what the spans' questions would read there once the spans are gone."""
        windows = preceding_windows(self.ids, self.notebook.config.repeat_key_window)
        inside = torch.zeros(len(self.ids), dtype=torch.bool)
        for a, b in spans:
            inside[a:b] = True
        written = inside & (self.beta > 0)
        keys = torch.unique(windows[written], dim=0)
        _, which = torch.unique(torch.cat([keys, windows]), dim=0, return_inverse=True)
        shared = torch.isin(which[len(keys):], which[:len(keys)])
        return (shared & ~inside & (self.beta > 0) & self.live(1)).nonzero().flatten()

    def find(self, text: str | bytes) -> list[tuple[int, int]]:
        """Every span of the record whose bytes are `text`."""
        needle = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        if not needle:
            raise ValueError("no text to find: it is empty")
        haystack = bytes(i - BYTE_OFFSET if i >= BYTE_OFFSET else 0 for i in self.ids.tolist())
        return [(m.start(), m.start() + len(needle)) for m in re.finditer(re.escape(needle), haystack)]

    def unlearn(self, span: tuple[int, int] | None = None, text: str | bytes | None = None,
                source: str | None = None, clear_shared_keys: bool = False) -> list[tuple[int, int]]:
        """Erase a fact given as a span of the record, as its text (every occurrence) or as a whole source
        (every segment read under that name): subtract its exact contribution from every memory. Returns the
        spans erased. What is gone already is refused (it would subtract nothing), unless clear_shared_keys asks to
        clear more.

        A repeat bank keys its writes by the last W' bytes only (4 in the shipped checkpoint), and every sentence
        that ends in the same W' bytes shares that key: once a fact's own writes are gone, its question can read
        what the others wrote there ("The vault code of Marlow is" answered with Tessa's code, through " is ").
        clear_shared_keys also subtracts from the repeat bank every other write made under a key the spans wrote
        under. The first memory keeps them, but the other facts lose the repeat bank's part of their recall:
        scripts/unlearn_hazard.py measures both ways on the shipped checkpoint. The default subtracts the spans'
        own writes only.
        """
        if sum(x is not None for x in (span, text, source)) != 1:
            raise ValueError("give exactly one of a span, a text or a source to unlearn")
        if span is not None:
            spans = [span]
        elif text is not None:
            spans = self.find(text)
            if not spans:
                raise ValueError(f"nothing to unlearn: {text!r} was never read")
        else:
            spans = [(s.start, s.end) for s in self.segments if s.source == source]
            if not spans:
                raise ValueError(f"nothing to unlearn: no source named {source!r} was read")
        erased = [0 <= a < b <= len(self.ids) and bool(self.erased[a:b].all()) for a, b in spans]
        if not clear_shared_keys and all(erased):  # it would subtract nothing (a bad span is refused below)
            raise ValueError(f"nothing left to unlearn: {'the span' if span is not None else repr(text or source)} "
                             "was unlearned already")
        state = self.cache.memory
        banks = self.notebook.banks()
        shared = self.shared_key_positions(spans) if clear_shared_keys and len(banks) > 1 else None
        for i, bank in enumerate(banks):  # each memory loses what the spans wrote into it
            total = self.contributions(spans, bank=i).sum(0)
            if i == 1 and shared is not None:  # and the repeat bank what others wrote under the spans' keys
                total = total + grouped_writes(bank.tables, self.ids, self.surviving_writes().float(), shared)
            state = dataclasses.replace(state, **{bank.field: getattr(state, bank.field) - total.unsqueeze(0)})
        self.cache.memory = state
        for a, b in spans:
            self.erased[a:b] = True
        if shared is not None:
            self.repeat_cleared[shared] = True
        return spans

    # ---- audit -------------------------------------------------------------------------------------

    @torch.no_grad()
    def summary(self) -> dict:
        """What the memory holds: bytes read, write mass Σβ, effective writes Σ D_u β_u, the memory's norm (a
        repeat bank's too) and, with bound keys, the bound on it."""
        surviving = survival(self.notebook.keep_factors(self.beta))
        live = self.beta * self.live()
        R = self.notebook.config.hrr_dim
        effective = float((surviving * live).sum())
        summary = {"bytes_read": int((self.ids != PAD_ID).sum()), "write_mass": float(live.sum()),
                   "effective_writes": effective,
                   "segments": len(self.segments), "erased_positions": int(self.erased.sum())}
        if self.notebook.config.repeat_key_window:
            summary["repeat_cleared_positions"] = int(self.repeat_cleared.sum())
        for bank in self.notebook.banks():
            spectrum = None if self.cache.is_empty() else getattr(self.cache.memory, bank.field)[0]
            name = bank.field.replace("spectrum", "memory_norm")  # memory_norm, repeat_memory_norm
            summary[name] = 0.0 if spectrum is None else torch.fft.irfft(spectrum, n=R).norm().item()
        # ‖M‖ = ‖Σ D_u β_u w_u‖ <= Σ D_u β_u ‖w_u‖, and a bound key's unit phases times a unit value make ‖w_u‖ = 1
        # (0 with an empty key window), so the effective writes bound each memory's norm; bundled keys give no bound
        if self.notebook.config.key_binding == "bind":
            summary["memory_norm_bound"] = effective
        return summary

    def effective_writes_ceiling(self) -> float | None:
        """1 / g: what the effective writes approach under forgetting (Σ_u D_u β_u obeys B <- (1 - gβ) B + β <= 1/g
        while gβ < 1 - keep_clamp), None without forgetting."""
        if not self.notebook.config.forgetting:
            return None
        return 1.0 / float(self.notebook.forget_rate().detach())

    @torch.no_grad()
    def attribute(
        self, prompt: str | bytes | torch.Tensor, answer: str | bytes | torch.Tensor, top: int = 3,
        segment_batch: int | None = None,
    ) -> list[ByteAttribution]:
        """For each byte of `answer` (text, bytes or ids [N], as `ask` returns them) after `prompt`: trunk vs
        notebook logit of that byte, and the segments ranked by the counterfactual drop of its logit if the segment
        were erased: s · ⟨C_f(t) ⊛† key_t, cv[y_t]⟩, taken through the read trust when the config has one (exact
        either way; the segment's own writes, as `unlearn(..., clear_shared_keys=False)` erases them). Segments are
        taken `segment_batch` at a time (default: as many as keep their spectra near 32 MiB), neighbours together,
        so memory stays flat however much was read and the record is traced about once."""
        prompt_ids, answer = as_ids(prompt), as_ids(answer)
        if len(prompt_ids) == 0 or len(answer) == 0:  # the first answer byte is predicted at the prompt's last
            raise ValueError(f"attribute needs a prompt and an answer of at least one byte each, got "
                             f"{len(prompt_ids)} and {len(answer)}")
        ids = torch.cat([prompt_ids, answer]).unsqueeze(0)
        cache = copy.deepcopy(self.cache)
        out = self.model(ids, cache=cache if not cache.is_empty() else None, use_cache=False,
                         output_write_strengths=True)
        steps = list(range(len(prompt_ids) - 1, ids.shape[1] - 1))  # the position that predicts each answer byte
        state = self.cache.memory if not self.cache.is_empty() else None
        banks = self.notebook.banks()  # the first memory and a repeat bank: the same β, their own keys
        keys = [trace(self.notebook, ids, None, state, write_mask=out.write_strengths, tables=bank.tables)[0].keys[0]
                for bank in banks]
        fade = torch.cumprod(self.notebook.keep_factors(out.write_strengths[0].float()), 0)  # contributions keep
        linear, _ = self.notebook(ids, None, state, write_mask=out.write_strengths)  # fading; the read before trust
        trunk, y = out.trunk_logits[0], answer
        reader = banks[0].tables.reader  # the banks share their values and read-out
        kept = [self.notebook.trusted(linear[0, t], trunk[t])[b] for t, b in zip(steps, y.tolist())]
        drops = torch.zeros(len(steps), len(self.segments))  # [N, S]
        batch = segment_batch or max(1, PIECE_ELEMENTS // (self.notebook.config.hrr_dim // 2 + 1))
        order = sorted(range(len(self.segments)), key=lambda i: self.segments[i].start)
        for first in range(0, len(order), batch):
            members = order[first:first + batch]
            spans = [(self.segments[i].start, self.segments[i].end) for i in members]
            sources = [self.contributions(spans, bank=i) for i in range(len(banks))]
            for j, t in enumerate(steps):
                reads = self.notebook.combine([bank.read_scale * reader(source * fade[t] * key[t].conj())
                                               for bank, source, key in zip(banks, sources, keys)])
                without = linear[0, t] - reads  # [batch, V]
                drops[j, members] = kept[j] - self.notebook.trusted(without, trunk[t])[:, y[j]]
        result = []
        for j, (t, b) in enumerate(zip(steps, y.tolist())):
            ranked = [(self.segments[i], float(drops[j, i]))
                      for i in torch.argsort(drops[j], descending=True)[:top].tolist()]
            shown = ids_to_bytes([b]).decode("utf-8", "replace") if b >= BYTE_OFFSET else f"<{b}>"
            result.append(ByteAttribution(shown, float(trunk[t, b]), float(out.memory_logits[0, t, b]),
                                          bool(out.memory_logits[0, t].argmax() == b), ranked))
        return result

    # ---- on disk -------------------------------------------------------------------------------------

    def save(self, path: str) -> None:
        """One safetensors file (atomic write): the cache, the record and the segments."""
        tensors, metadata = self.cache.to_safetensors()
        tensors.update({"record.ids": self.ids.to(torch.int16), "record.beta": self.beta.float(),
                        "record.erased": self.erased.to(torch.uint8),
                        "record.repeat_cleared": self.repeat_cleared.to(torch.uint8)})
        metadata.update({"format": SESSION_FORMAT, "session_version": SESSION_VERSION,
                         "segments": json.dumps([asdict(s) for s in self.segments]),
                         "model_path": self.model_path or ""})
        save_safetensors(tensors, path, metadata)

    def save_to_folder(self, folder: str) -> None:
        """What `push_to_hub` uploads: the memory file and a small card (memory_hub.py)."""
        from .memory_hub import save_to_folder

        save_to_folder(self, folder)

    def push_to_hub(self, repo_id: str, private: bool | None = None, token: str | None = None,
                    commit_message: str = "Upload a kathleen-notebook memory") -> str:
        """Share this memory as a Hub model repository; returns the commit's URL (memory_hub.py)."""
        from .memory_hub import push_to_hub

        return push_to_hub(self, repo_id, private, token, commit_message)

    @classmethod
    def from_hub(cls, repo_id: str, model: str | None = None, revision: str | None = None,
                 **hub_kwargs) -> NotebookSession:
        """A session with the memory of a Hub repository made by `push_to_hub`, or a local folder of
        `save_to_folder`, with its model unless `model` names another (memory_hub.py)."""
        from .memory_hub import from_hub

        return from_hub(repo_id, model, revision, **hub_kwargs)

    def load(self, path: str) -> None:
        """Replace this session's memory by the one in `path`. Everything is checked first, so a
        foreign, truncated or wrong-version file raises `ValueError` and leaves the memory as it was."""
        tensors, metadata = read_safetensors(path, SESSION_FORMAT)
        if metadata.get("session_version") not in READABLE_VERSIONS:
            raise ValueError(f"{path} has session version {metadata.get('session_version')!r}, "
                             f"this code reads {' and '.join(READABLE_VERSIONS)}")
        cache = KathleenCache.from_safetensors(tensors, metadata, self.model.config, str(path))
        try:
            ids, beta = tensors["record.ids"].long(), tensors["record.beta"].float()
            erased = tensors["record.erased"].bool()
            cleared = (tensors["record.repeat_cleared"].bool() if metadata["session_version"] != "1"
                       else torch.zeros_like(erased))
            segments = [Segment(**s) for s in json.loads(metadata["segments"])]
        except (KeyError, TypeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path} lacks a complete record ({error})") from None
        if not len(ids) == len(beta) == len(erased) == len(cleared):
            raise ValueError(f"{path} has a record of inconsistent lengths")
        self.cache, self.ids, self.beta, self.erased, self.segments = cache, ids, beta, erased, segments
        self.repeat_cleared = cleared
        self.model_path = metadata.get("model_path") or self.model_path


def sentence_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each sentence or line of `data`, without the whitespace between them."""
    spans, start = [], 0
    for match in SENTENCE_END.finditer(data):
        if match.start() > start:
            spans.append((start, match.start()))
        start = match.end()
    if start < len(data):
        spans.append((start, len(data)))
    return spans
