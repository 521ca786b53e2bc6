"""The `kathleen-notebook` command line, one function per subcommand.

    kathleen-notebook demo                          the shipped checkpoint: generate, recall, unlearn, attribute
    kathleen-notebook smoke                         a one-minute tour of the modules, untrained
    kathleen-notebook train CONFIG [k=v ...]         train (scripts/train.py under torchrun: several processes)
    kathleen-notebook eval-bpb MODEL FILE... [--window L]     exact bits/byte, streamed in constant memory
    kathleen-notebook needle [--quick]                        the needle laboratory (SPEC §6.1)
    kathleen-notebook facts MODEL [--lengths ...]             fact recall in real text, held-out phrasings
    kathleen-notebook memory read MEMORY FILE... --model M    build a memory file from documents
    kathleen-notebook memory ask|attribute MEMORY PROMPT      generate with it / say where each byte came from
    kathleen-notebook memory unlearn MEMORY TEXT              erase a fact exactly
    kathleen-notebook memory show MEMORY                      what the memory holds
    kathleen-notebook memory push|pull MEMORY REPO            share a memory on the Hub / fetch one
    kathleen-notebook serve [MODEL] [--port N]                the memory workbench in a browser (Gradio)
    kathleen-notebook export OUT.onnx [--model M]             the one-byte step as an ONNX graph
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from .allocator import keep_freed_memory
from .scoring import STREAM_CHUNK

NEEDLE_DEFAULTS = {"spec": "configuration/experiments/needle.json", "out": "runs/needle",
                   "report": "reports/needle.md", "parallel": 2, "setting": None}


def smoke(args: argparse.Namespace) -> None:
    from .experiments.smoke import run_smoke

    run_smoke(args.threads, args.seed, args.trials)


def demo_command(args: argparse.Namespace) -> None:
    from .experiments.demo import run_demo

    run_demo(args.model, args.facts, args.seed, args.threads, args.split)


def train_command(args: argparse.Namespace) -> None:
    """Train from a JSON config with section.key=value overrides; --resume continues the newest checkpoint."""
    import logging

    from tqdm.contrib.logging import logging_redirect_tqdm

    from .training import load_training_config, train

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = load_training_config(args.config, args.overrides)
    if "base_config" not in config.model:
        # measured for the Kathleen model's allocations only; a Mamba trunk's parallel scan fragments the
        # mmap-less heap until the process is killed (15 GB at step 140 of the adapter needle run)
        keep_freed_memory()
    with logging_redirect_tqdm():  # accelerate's log lines above the progress bar, not through it
        output = train(config, resume=args.resume)
    print(f"done: {output}/final (model), {output}/metrics.jsonl, {output}/curves.png")


def eval_bpb_command(args: argparse.Namespace) -> None:
    """Score files (optionally a byte range of each) as one stream or in independent windows."""
    from .scoring import byte_bits
    from .tokenization_kathleen import bytes_to_ids

    torch.set_num_threads(args.threads)
    if args.write_lm_eval_text:
        data = read_range(args.write_lm_eval_text, args.byte_range)
        Path(args.lm_eval_out).write_bytes(data)
        print(f"wrote {len(data):,} bytes of {args.write_lm_eval_text} to {args.lm_eval_out} (the kathleen_text task "
              "of configuration/lm_eval reads kathleen_eval_text.txt in the working directory)")
        return
    if args.model is None or not args.files:
        raise SystemExit("eval-bpb needs a MODEL and at least one FILE")
    from transformers import AutoModelForCausalLM

    if args.by_position and args.window is not None:
        raise SystemExit("--by-position reads one stream: leave out --window")
    check_input_files(args.files, args.byte_range)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    # with a memory, its trunk's own logits too: where the read starts to help or to hurt
    readouts = ("logits", "trunk_logits") if args.by_position and getattr(model.config, "memory", "none") != "none" \
        else ("logits",)
    total_bits, total_bytes = 0.0, 0
    for name in args.files:
        ids = bytes_to_ids(read_range(name, args.byte_range))
        start = time.perf_counter()
        bits, *trunk_bits = byte_bits(model, ids, args.window, args.chunk_size, progress=name, readout=readouts)
        total_bits, total_bytes = total_bits + bits.sum().item(), total_bytes + bits.numel()
        print(f"{name}: {bits.mean().item():.4f} bits/byte over {bits.numel():,} bytes "
              f"({bits.numel() / (time.perf_counter() - start):,.0f} bytes/s)")
        if args.by_position:
            for lo, hi in position_ranges(len(bits)):
                trunk = f", its trunk alone {trunk_bits[0][lo:hi].mean().item():.4f}" if trunk_bits else ""
                print(f"  bytes {lo:,}-{hi:,}: {bits[lo:hi].mean().item():.4f}{trunk}")
    protocol = "one stream" if args.window is None else f"windows of {args.window}"
    print(f"total: {total_bits / total_bytes:.4f} bits/byte over {total_bytes:,} bytes ({protocol}, "
          f"{args.threads} thread(s))")


def position_ranges(length: int, first: int = 512, factor: int = 4) -> list[tuple[int, int]]:
    """[0, 512), [512, 2,048), [2,048, 8,192), ... cut at `length`: stream positions, each range `factor` times the
    one before."""
    edges = [0, first]
    while edges[-1] < length:
        edges.append(edges[-1] * factor)
    edges = [min(edge, length) for edge in edges]
    return [(lo, hi) for lo, hi in zip(edges, edges[1:]) if hi > lo]


def read_range(name: str, byte_range: list[int] | None) -> bytes:
    data = Path(name).read_bytes()
    if not data or (byte_range is not None and not data[byte_range[0]:byte_range[1]]):
        raise ValueError(f"{name}{'' if byte_range is None else ' ' + str(byte_range)} holds no bytes to score")
    return data if byte_range is None else data[byte_range[0]:byte_range[1]]


def check_input_files(names: list[str], byte_range: list[int] | None = None) -> None:
    """Name a missing or empty input file before any model loads (a large one takes a while); read_range checks
    again when it reads."""
    for name in names:
        if not Path(name).is_file():
            raise FileNotFoundError(f"{name} is not a file")
        size = Path(name).stat().st_size
        if size == 0 or (byte_range is not None and not range(size)[byte_range[0]:byte_range[1]]):
            raise ValueError(f"{name}{'' if byte_range is None else ' ' + str(byte_range)} holds no bytes to "
                             "read")


def needle_command(args: argparse.Namespace) -> None:
    """Train and evaluate the four needle arms of the pre-registered spec; write the report."""
    import logging

    from .experiments.needle_lab import run_lab

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the lab reports its progress by logging
    torch.set_num_threads(1)
    if args.quick and args.setting:
        raise ValueError("give --quick or --setting, not both")
    setting = args.setting or ("quick" if args.quick else "full")
    command = "kathleen-notebook needle" + (" --quick" if args.quick else "") + (
        " --report-only" if args.report_only else "") + "".join(
        f" --{name} {getattr(args, name)}" for name in ("spec", "out", "report", "parallel", "setting")
        if getattr(args, name) != NEEDLE_DEFAULTS[name])
    run_lab(args.spec, setting, args.out, args.report, args.parallel, command, args.report_only)



def facts_command(args: argparse.Namespace) -> None:
    """Fact recall of a checkpoint on held-out (or training) phrasings planted in real prose."""
    import logging
    import shlex
    import sys

    from transformers import AutoModelForCausalLM

    from .experiments.fact_recall import evaluate_fact_recall, format_table

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    name, _, span = args.corpus.partition(":")
    if not Path(name).is_file():
        raise SystemExit(f"facts: --corpus {name} does not exist (give a text file, optionally FILE:START:END)")
    try:
        byte_range = [int(x) for x in span.split(":")] if span else None
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        raise SystemExit(f"facts: --corpus takes FILE or FILE:START:END and --lengths comma-separated integers, "
                         f"got {args.corpus!r} and {args.lengths!r}") from None
    filler = read_range(name, byte_range)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    results = evaluate_fact_recall(model, filler, lengths, args.documents, args.facts, args.seed, args.split)
    print(format_table(results))
    if args.out:
        command = "kathleen-notebook " + shlex.join(sys.argv[1:]) if sys.argv[0].endswith("kathleen-notebook") else ""
        record = {"model": args.model, "corpus": args.corpus, "split": args.split, "facts_per_document": args.facts,
                  "documents": args.documents, "seed": args.seed, "threads": args.threads, "command": command,
                  "results": results}
        Path(args.out).write_text(json.dumps(record, indent=1))
        print(f"wrote {os.path.relpath(args.out)}")


def memory_command(args: argparse.Namespace) -> None:
    """read / ask / unlearn / attribute / show / push / pull on a memory file (see `NotebookSession`)."""
    from .session import NotebookSession

    torch.set_num_threads(args.threads)
    path = Path(args.memory)
    text = " ".join(args.inputs)
    if args.action in ("ask", "attribute", "unlearn") and not text.strip():
        what = "text to unlearn" if args.action == "unlearn" else "prompt"
        raise ValueError(f"memory {args.action} needs a {what} after the memory file (it is empty)")
    if args.action == "read" and not args.inputs:
        raise ValueError("memory read needs at least one FILE to read")
    if args.action == "read":
        check_input_files(args.inputs)
    if args.action in ("push", "pull") and len(args.inputs) != 1:
        raise ValueError(f"memory {args.action} needs one REPO (a Hub repository id) after the memory file")
    if args.action == "pull":  # the memory of a Hub repository (or of a cached copy, offline) into a file
        session = NotebookSession.from_hub(args.inputs[0], model=args.model)
        session.save(str(path))
        print(f"wrote {path} from {args.inputs[0]}")
    elif args.action == "read" and not path.exists():
        from .session import DEFAULT_CHECKPOINT

        if args.model is None:
            print(f"a new memory of the shipped checkpoint {DEFAULT_CHECKPOINT.name} (--model picks another)")
        session = NotebookSession.from_pretrained(args.model or str(DEFAULT_CHECKPOINT))
    else:
        model_path = args.model or session_model_path(path)
        session = NotebookSession.from_pretrained(model_path)
        session.load(str(path))
    if args.action == "push":
        print(f"uploaded: {session.push_to_hub(args.inputs[0], private=args.private)}")
    elif args.action == "read":
        for name in args.inputs:
            data = Path(name).read_bytes()
            segments = session.read(data, source=name)
            print(f"read {len(data):,} bytes from {name}: {len(segments)} segments")
        session.save(str(path))
    elif args.action == "ask":
        print(session.ask_text(text, max_new_tokens=args.max_new_tokens))
    elif args.action == "attribute":
        answer = session.ask(text, max_new_tokens=args.max_new_tokens)
        for item in session.attribute(text, answer, top=1):
            source = item.sources[0] if item.sources else None
            where = f"{source[0].source}: {source[0].text[:60]!r} (drop {source[1]:+.2f})" if source else "-"
            print(f"{item.byte!r:>6}  trunk {item.trunk_logit:+7.2f}  notebook {item.memory_logit:+7.2f}  {where}")
    elif args.action == "unlearn":
        spans = session.unlearn(text=text, clear_shared_keys=args.clear_shared_keys)
        session.save(str(path))
        print(f"unlearned {len(spans)} occurrence(s): {spans}")
    # what the memory holds; asking leaves it as it was, so there it goes to stderr and stdout is the answer alone
    print(json.dumps(session.summary()), file=sys.stderr if args.action in ("ask", "attribute") else sys.stdout)


def serve_command(args: argparse.Namespace) -> None:
    from .workbench import build_app

    torch.set_num_threads(args.threads)
    try:
        app = build_app(args.model, max_document_bytes=args.max_document_bytes, max_new_tokens=args.max_new_tokens)
    except ImportError as error:  # Gradio missing: build_app says how to install it
        raise SystemExit(f"kathleen-notebook serve: error: {error}") from None
    app.launch(server_name=args.host, server_port=args.port)


def export_command(args: argparse.Namespace) -> None:
    """Write the model's one-byte step as an ONNX graph (optional `[export]` extra)."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as error:
        raise ValueError(f"export needs onnx and onnxscript: pip install 'kathleen-notebook[export]' ({error})") \
            from None
    from .export import export_step
    from .modeling_kathleen import KathleenForCausalLM
    from .session import DEFAULT_CHECKPOINT

    torch.set_num_threads(args.threads)
    model = KathleenForCausalLM.from_pretrained(args.model or str(DEFAULT_CHECKPOINT))
    path = export_step(model, args.output)
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    print(f"wrote {path} ({size:,} bytes with its data); run it without PyTorch: "
          f"python scripts/onnx_generate.py {path} --prompt TEXT [--cache MEMORY]")


def positive_int(text: str) -> int:
    """A count (threads, bytes, facts, trials) that must be at least 1: argparse names a bad one in one line."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} is not a count of at least 1")
    return number


def port_number(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port


def session_model_path(path: Path) -> str:
    """The model a memory file was built with, as recorded in it."""
    from .cache import read_safetensors

    _, metadata = read_safetensors(path, "kathleen-notebook-session")
    if not metadata.get("model_path"):
        raise SystemExit(f"{path} does not record its model; pass --model")
    return metadata["model_path"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kathleen-notebook", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="the shipped checkpoint: generate, recall, unlearn, attribute")
    demo.add_argument("--model", help="another checkpoint folder or Hub id (default: the shipped one)")
    demo.add_argument("--facts", type=positive_int, default=8, help="facts planted in the demo document")
    demo.add_argument("--seed", type=int, default=0, help="seed of the facts and of sampling")
    demo.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    demo.add_argument("--split", choices=["held_out", "train"], default="held_out",
                      help="facts phrased as never trained on (default) or as in training (facts.py's parts)")
    demo.set_defaults(run=demo_command)
    tour = commands.add_parser("smoke", help="a one-minute tour of the modules on an untrained model")
    tour.add_argument("--seed", type=int, default=42, help="seed of the untrained model and its inputs")
    tour.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    tour.add_argument("--trials", type=positive_int, default=10, help="recall trials of the oracle-gated notebook")
    tour.set_defaults(run=smoke)
    trainer = commands.add_parser("train", help="train a model from a JSON config (see configuration/presets)")
    trainer.add_argument("config", help="a training config, e.g. configuration/presets/text-notebook.json")
    trainer.add_argument("overrides", nargs="*", default=[],
                         help="section.key=value, e.g. train.steps=200 model.memory=none")
    trainer.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    trainer.set_defaults(run=train_command)
    scorer = commands.add_parser("eval-bpb", help="exact bits/byte of text files")
    scorer.add_argument("model", nargs="?", help="checkpoint folder or Hub id")
    scorer.add_argument("files", nargs="*", default=[], help="text files, each scored on its own")
    scorer.add_argument("--window", type=positive_int,
                        help="independent windows of this many bytes (default: one stream)")
    scorer.add_argument("--chunk-size", type=positive_int, default=STREAM_CHUNK,
                        help="bytes per forward call (memory stays flat)")
    scorer.add_argument("--byte-range", type=int, nargs=2, metavar=("START", "END"), help="score these bytes only")
    scorer.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    scorer.add_argument("--by-position", action="store_true",
                        help="one stream: also bits/byte per range of positions (0-512, 512-2,048, ... x4), and for "
                             "a model with a memory its trunk's alone: does the memory hold over a long text?")
    scorer.add_argument("--write-lm-eval-text", metavar="FILE", help="instead of scoring: copy FILE (its "
                        "--byte-range) to --lm-eval-out for lm-evaluation-harness's kathleen_text task")
    scorer.add_argument("--lm-eval-out", default="kathleen_eval_text.txt", help="where --write-lm-eval-text "
                        "writes (the task reads kathleen_eval_text.txt in the working directory)")
    scorer.set_defaults(run=eval_bpb_command)
    lab = commands.add_parser("needle", help="the needle laboratory: four arms, zero-shot to 16x")
    lab.add_argument("--quick", action="store_true", help="the spec's quick setting (under 20 minutes)")
    lab.add_argument("--report-only", action="store_true", help="rewrite the report from the last results.json")
    lab.add_argument("--setting", help="another setting of the spec than full or quick (its \"settings\" keys)")
    lab.add_argument("--spec", default=NEEDLE_DEFAULTS["spec"], help="the pre-registered experiment spec")
    lab.add_argument("--out", default=NEEDLE_DEFAULTS["out"], help="folder of the runs and results.json")
    lab.add_argument("--report", default=NEEDLE_DEFAULTS["report"], help="the report to write (.md, .png beside)")
    lab.add_argument("--parallel", type=positive_int, default=NEEDLE_DEFAULTS["parallel"],
                     help="training runs at a time (one thread each)")
    lab.set_defaults(run=needle_command)
    facts = commands.add_parser("facts", help="fact recall in real prose at 512 to 16,384 bytes (issue 18)")
    facts.add_argument("model", help="checkpoint folder or Hub id")
    facts.add_argument("--corpus", default="../shared/data/enwiki_excerpt.xml:5480771:6089746",
                       help="filler text, FILE or FILE:START:END (default: the enwiki test split)")
    facts.add_argument("--lengths", default="512,2048,8192,16384", help="document lengths in bytes, comma-separated")
    facts.add_argument("--documents", type=positive_int, default=8, help="documents per length")
    facts.add_argument("--facts", type=positive_int, default=8, help="facts planted per document")
    facts.add_argument("--split", choices=["held_out", "train"], default="held_out",
                       help="phrasings, names and value alphabets: held out from training (default) or trained on")
    facts.add_argument("--seed", type=int, default=0, help="seed of the documents and facts")
    facts.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    facts.add_argument("--out", help="write the results as JSON here")
    facts.set_defaults(run=facts_command)
    memory = commands.add_parser("memory", help="build, query, edit and audit a memory file")
    memory.add_argument("action", choices=["read", "ask", "unlearn", "attribute", "show", "push", "pull"],
                        help="what to do with the memory file")
    memory.add_argument("memory", help="the memory file (safetensors)")
    memory.add_argument("inputs", nargs="*", default=[],
                        help="files to read, the prompt / text to unlearn, or the Hub REPO to push to / pull from")
    memory.add_argument("--private", action="store_true", help="push: make a new repository private")
    memory.add_argument("--model", help="checkpoint folder or Hub id (default: the one recorded in the file; "
                        "for a new file, the shipped checkpoint)")
    memory.add_argument("--max-new-tokens", type=positive_int, default=64, help="bytes to generate for ask / attribute")
    memory.add_argument("--clear-shared-keys", action="store_true", help="unlearn: also clear from a repeat bank what "
                        "other sentences wrote under the text's short keys, so its question cannot read their values "
                        "there (the other facts lose that bank's help: NotebookSession.unlearn)")
    memory.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    memory.set_defaults(run=memory_command)
    exporter = commands.add_parser("export", help="the one-byte step as an ONNX graph (runs in onnxruntime)")
    exporter.add_argument("output", help="the .onnx file to write (tables go to OUTPUT.data beside it)")
    exporter.add_argument("--model", help="checkpoint folder or Hub id (default: the shipped checkpoint)")
    exporter.add_argument("--threads", type=positive_int, default=1, help="torch threads while exporting")
    exporter.set_defaults(run=export_command)
    server = commands.add_parser("serve", help="the memory workbench in a browser: read, ask, provenance, unlearn")
    server.add_argument("model", nargs="?", help="checkpoint folder or Hub id (default: the shipped one)")
    server.add_argument("--port", type=port_number, help="port to listen on (default: 7860 or the next free one)")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    server.add_argument("--max-document-bytes", type=positive_int, default=100_000,
                        help="largest document a page reads")
    server.add_argument("--max-new-tokens", type=positive_int, default=48, help="bytes generated per answer")
    server.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    server.set_defaults(run=serve_command)
    return parser


def check_model_argument(model: str | None) -> None:
    """A MODEL written as a local path (absolute, ./, ../, ~, or more than one /) must exist: Transformers would take
    a missing one for a malformed Hub repo id and say that instead."""
    if model and (model.startswith(("/", "./", "../", "~")) or model.count("/") > 1) \
            and not Path(model).expanduser().exists():
        raise FileNotFoundError(f"no model folder {model} (a Hub model is named NAMESPACE/NAME)")


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.run is train_command:  # overrides may stand before or after --resume
        args.overrides += [a for a in unknown if "=" in a and not a.startswith("-")]
        unknown = [a for a in unknown if a not in args.overrides]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.run is not train_command:  # train_command decides for itself
        keep_freed_memory()  # halves the step time of notebook training on glibc (see allocator.py)
    try:
        check_model_argument(getattr(args, "model", None))
        args.run(args)
    except (OSError, ValueError, KeyError) as error:  # bad input: one line naming it (a traceback on request)
        if os.environ.get("KATHLEEN_NOTEBOOK_TRACEBACK"):
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SystemExit(f"kathleen-notebook {args.command}: error: {message}") from None
    except KeyboardInterrupt:
        raise SystemExit(f"kathleen-notebook {args.command}: interrupted") from None


if __name__ == "__main__":
    main()
