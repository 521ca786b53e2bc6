"""`kathleen-notebook demo`: what the shipped checkpoint does, in under a minute, with no training.

1. continue a text prompt;
2. read a long document (>= 4x the training length) with planted facts into the notebook and ask
   for every fact (accuracy printed);
3. unlearn one fact: it stops being recalled, the others still are;
4. name the source sentence of each recalled byte;
5. save the memory to a file, load it into a fresh session, ask again.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

import torch

from ..session import DEFAULT_CHECKPOINT, PACKAGE_DATA, NotebookSession
from .fact_recall import session_answers, value_accuracy
from .facts import FactGenerator, plant_facts

DEMO_TEXT = PACKAGE_DATA / "demo_text.txt"  # the opening of Alice's Adventures in Wonderland (public domain)


def run_demo(model_path: str | None = None, n_facts: int = 8, seed: int = 0, threads: int = 1,
             split: str = "held_out") -> dict:
    """The tour. split: the facts' phrasings, names and values: "held_out" (never trained on) or "train"."""
    generator = FactGenerator(split)
    if not 2 <= n_facts <= len(generator.names):  # before the model loads: one fact is unlearned, the others kept
        raise ValueError(f"the demo unlearns one fact and asks the others again: give 2 to {len(generator.names)} "
                         f"facts, not {n_facts}")
    torch.set_num_threads(threads)
    started = time.perf_counter()
    path = str(model_path or DEFAULT_CHECKPOINT)
    session = NotebookSession.from_pretrained(path)
    config = session.model.config
    print(f"checkpoint {path}: {sum(p.numel() for p in session.model.parameters()):,} parameters, "
          f"d_model {config.d_model} x {config.n_layers} blocks + notebook (R = {config.hrr_dim})")

    torch.manual_seed(seed)
    prompt = "Alice was beginning to get very tired of"
    continuation = session.ask_text(prompt, max_new_tokens=120, do_sample=True, top_k=8)
    print(f"\n1. Continuation (sampled, seed {seed}):\n   {prompt}{continuation!r}")

    rng = random.Random(seed)
    facts = generator.facts(n_facts, rng)
    document, _ = plant_facts(DEMO_TEXT.read_bytes()[:2600], facts, rng)
    session.read(document, source="document")
    answers = session_answers(session, facts)
    before = value_accuracy(facts, answers)
    print(f"\n2. Read a {len(document):,}-byte document ({len(document) / 512:.1f}x the 512-byte training length) "
          f"with {n_facts} planted facts ({split.replace('_', '-')} phrasings); asked for each:")
    for fact, answer in zip(facts, answers):
        print(f"   {fact.prompt}-> {answer!r:10} (stored {fact.value!r})")
    print(f"   recall: {before:.0%} of value bytes")

    # unlearn the best-recalled fact, so that its forgetting shows
    scores = [value_accuracy([f], [a]) for f, a in zip(facts, answers)]
    v = max(range(n_facts), key=scores.__getitem__)
    victim, others = facts[v], [f for i, f in enumerate(facts) if i != v]
    session.unlearn(text=victim.sentence)
    after = session_answers(session, facts)
    kept_before = value_accuracy(others, [a for i, a in enumerate(answers) if i != v])
    kept = value_accuracy(others, [a for i, a in enumerate(after) if i != v])
    erased = value_accuracy([victim], [after[v]])
    print(f"\n3. Unlearned {victim.sentence!r}: its recall {scores[v]:.0%} -> {erased:.0%}; "
          f"the other {n_facts - 1} facts {kept_before:.0%} -> {kept:.0%}")

    w = max((i for i in range(n_facts) if i != v), key=scores.__getitem__)  # the best-recalled fact left
    fact = facts[w]
    answer = session.ask(fact.query, max_new_tokens=len(fact.value), do_sample=False, eos_token_id=None)
    print(f"\n4. Where each byte of {fact.prompt!r}-> {after[w]!r} came from:")
    for item in session.attribute(fact.query, answer, top=1):
        source = item.sources[0] if item.sources else None
        where = f"{source[0].text[:48]!r} (logit drop if erased {source[1]:+.2f})" if source else "-"
        print(f"   {item.byte!r}: trunk {item.trunk_logit:+6.2f} notebook {item.memory_logit:+6.2f}  <- {where}")

    with tempfile.TemporaryDirectory() as folder:
        memory_file = Path(folder) / "memory.safetensors"
        session.save(str(memory_file))
        restored = NotebookSession(session.model)
        restored.load(str(memory_file))
        same = session_answers(restored, facts) == after
        print(f"\n5. Memory saved ({memory_file.stat().st_size:,} bytes) and reloaded into a new session: "
              f"answers {'identical' if same else 'DIFFERENT'}")
    print(f"\ndone in {time.perf_counter() - started:.1f}s ({threads} thread(s))")
    return {"recall": before, "erased_after": erased, "kept_after": kept, "reload_identical": same}
