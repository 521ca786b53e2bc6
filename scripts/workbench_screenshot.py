"""Screenshot the memory workbench after a provenance query: reports/workbench.png (shown in the README).

    python scripts/workbench_screenshot.py [--model CHECKPOINT] [--facts 4] [--seed 0] [--out reports/workbench.png]

Serves the workbench in this process on a free port, opens it in headless Chromium (Playwright's, else the
system's; scripts/install_browser.sh), reads the opening of the demo text with `--facts` held-out facts planted
at word boundaries (facts.py, seed `--seed`), asks for the facts in order until one is recalled (each answer is
printed) and photographs the page.
"""

from __future__ import annotations

import argparse
import random
import shutil
import socket
from pathlib import Path

import torch

from modeling_kathleen_notebook.experiments.demo import DEMO_TEXT
from modeling_kathleen_notebook.experiments.facts import FactGenerator, plant_facts
from modeling_kathleen_notebook.workbench import build_app


def browser_path(playwright) -> str:
    own = playwright.chromium.executable_path
    if own and Path(own).exists():
        return own
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        raise SystemExit("no Chromium: run scripts/install_browser.sh")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint folder or Hub id (default: the shipped one)")
    parser.add_argument("--facts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="reports/workbench.png")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from playwright.sync_api import expect, sync_playwright

    rng = random.Random(args.seed)
    facts = FactGenerator("held_out").facts(args.facts, rng)
    document, _ = plant_facts(DEMO_TEXT.read_bytes()[:1500], facts, rng)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = build_app(args.model, max_new_tokens=24)
    app.launch(server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=browser_path(p))
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"http://127.0.0.1:{port}")
            page.locator("#document textarea").fill(document.decode("utf-8"))
            page.locator("#source input, #source textarea").first.fill("alice-with-facts.txt")
            page.locator("#read").click()
            expect(page.locator("#status")).to_contain_text("of alice-with-facts.txt", timeout=120_000)
            asked = 0
            for fact in facts:  # in order, until one is recalled (every answer is printed)
                asked += 1
                page.locator("#prompt textarea, #prompt input").first.fill(fact.prompt.strip())
                page.locator("#ask").click()
                expect(page.locator("#status")).to_contain_text("Answered", timeout=120_000)
                answer = page.locator("#answer textarea").input_value()
                print(f"asked {fact.prompt.strip()!r} (stored {fact.value!r}): {answer!r}")
                if answer.strip().startswith(fact.value):
                    break
            recalled = page.locator("#provenance .kn-recalled")
            if recalled.count():
                recalled.first.hover()  # its tooltip: trunk vs notebook logit and the counterfactual drop
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=args.out, full_page=True)
            print(f"{asked} of {len(facts)} facts asked; {recalled.count()} characters of the last answer recalled "
                  f"from memory; wrote {args.out}")
            browser.close()
    finally:
        app.close()


if __name__ == "__main__":
    main()
