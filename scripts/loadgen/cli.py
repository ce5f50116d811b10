"""Command line of the load generator: one run, one JSON line on stdout (progress on stderr).

python scripts/loadgen --url http://127.0.0.1:8000 --workload chat --concurrency 8 --requests 64
python scripts/loadgen --url http://127.0.0.1:8080 --model default_model --rate 2 --requests 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from scripts.loadgen.progress import ProgressLine
from scripts.loadgen.runner import LoadConfig, run_load
from scripts.loadgen.workloads import ALIASES, WORKLOADS, Shape


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    """The options shared by the load generator and the comparison runner."""
    d, s = LoadConfig(url=""), Shape()
    names = ", ".join([*WORKLOADS, *ALIASES])
    p.add_argument("--workload", default=d.workload, help=f"prompt set: {names}")
    p.add_argument("--requests", type=int, default=d.requests, help="requests per run")
    p.add_argument(
        "--concurrency", type=int, default=d.concurrency, help="closed loop: requests in flight"
    )
    p.add_argument(
        "--rate", type=float, help="open loop: mean requests/s, Poisson arrivals (no --concurrency)"
    )
    p.add_argument("--seed", type=int, default=d.seed, help="workload and arrival seed")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--warmup", type=int, default=d.warmup, help="unmeasured requests first")
    p.add_argument(
        "--max-duration", type=float, default=d.max_duration_s, help="seconds; no new request after"
    )
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s, help="seconds")
    p.add_argument("--tenants", type=int, default=s.tenants, help="multi_tenant: system prompts")
    p.add_argument(
        "--prefix-words", type=int, default=s.prefix_words, help="system prompt words (~1.1 tok)"
    )
    p.add_argument("--turns", type=int, default=s.turns, help="multi_turn: turns per conversation")
    p.add_argument("--shots", type=int, default=s.shots, help="few_shot: example pairs")
    p.add_argument(
        "--long-every",
        type=int,
        default=s.long_every,
        help="cold_mix: one long cold prompt (--prefix-words words) in this many requests",
    )


def load_config(args: argparse.Namespace, url: str, model: str | None) -> LoadConfig:
    shape = Shape(
        tenants=args.tenants,
        prefix_words=args.prefix_words,
        turns=args.turns,
        shots=args.shots,
        long_every=args.long_every,
    )
    return LoadConfig(
        url=url,
        workload=args.workload,
        requests=args.requests,
        concurrency=args.concurrency,
        rate=args.rate,
        seed=args.seed,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        model=model,
        warmup=args.warmup,
        max_duration_s=args.max_duration,
        request_timeout_s=args.request_timeout,
        shape=shape,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="loadgen",
        description="Streaming chat-completion load against an OpenAI-compatible server; "
        "prints one JSON report line.",
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--model",
        help="model name to send (default: first of /v1/models; "
        "mlx_lm.server wants 'default_model')",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_load_arguments(p)
    args = p.parse_args(argv)
    config = load_config(args, args.url, args.model)
    progress = None if args.quiet else ProgressLine(f"{config.workload} @ {config.url}")
    try:
        report = asyncio.run(run_load(config, progress))
    except (RuntimeError, ValueError) as e:
        print(f"loadgen: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report), flush=True)
    return 0 if report["errors"] == 0 else 1
