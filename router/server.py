"""Command line: run the router (`python -m router --model DIR ...`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from aiohttp import web

from router.app import create_app
from router.config import RouterConfig
from router.policy import POLICY_NAMES

_DEFAULTS = RouterConfig(model_dir=Path("."))


def parse_args(argv: list[str] | None) -> RouterConfig:
    p = argparse.ArgumentParser(
        prog="python -m router",
        description="mlx-fleet router: an OpenAI-compatible HTTP API in front of MLX workers, "
        "routing each prompt to the worker most likely to hold its prefix in cache.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--model",
        required=True,
        type=Path,
        metavar="DIR",
        help="local model directory (tokenizer files, chat template, config.json)",
    )
    p.add_argument("--model-id", help="model name clients send (default: the directory's name)")
    p.add_argument("--host", default=_DEFAULTS.host, help="HTTP address to bind")
    p.add_argument("--port", type=int, default=_DEFAULTS.port, help="HTTP port")
    p.add_argument(
        "--zmq-bind", default=_DEFAULTS.zmq_bind, help="ZeroMQ ROUTER address workers connect to"
    )
    p.add_argument("--policy", choices=POLICY_NAMES, default=_DEFAULTS.policy)
    p.add_argument(
        "--prefill-weight",
        type=float,
        default=_DEFAULTS.prefill_weight,
        help="cache_aware: cost of one uncached prompt block, in queued requests",
    )
    p.add_argument(
        "--balance-abs-threshold",
        type=int,
        default=_DEFAULTS.balance_abs_threshold,
        help="cache_aware: fall back to least-load when max - min load exceeds this...",
    )
    p.add_argument(
        "--balance-rel-threshold",
        type=float,
        default=_DEFAULTS.balance_rel_threshold,
        help="...and max load exceeds this times the min load",
    )
    p.add_argument(
        "--prefix-ttl",
        type=float,
        default=_DEFAULTS.prefix_ttl_s,
        help="seconds an optimistic prefix entry lives without a KV event",
    )
    p.add_argument(
        "--heartbeat-interval",
        type=float,
        default=_DEFAULTS.heartbeat_interval_s,
        help="seconds between worker heartbeats (told to workers)",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=_DEFAULTS.heartbeat_timeout_s,
        help="seconds of silence after which a worker is lost",
    )
    p.add_argument(
        "--max-pending",
        type=int,
        default=_DEFAULTS.max_pending_requests,
        help="requests in flight in the router; more are refused with 429",
    )
    p.add_argument(
        "--context-length",
        type=int,
        help="override the model's context length (default: config.json)",
    )
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return RouterConfig(
        model_dir=args.model,
        model_id=args.model_id,
        host=args.host,
        port=args.port,
        zmq_bind=args.zmq_bind,
        policy=args.policy,
        prefill_weight=args.prefill_weight,
        balance_abs_threshold=args.balance_abs_threshold,
        balance_rel_threshold=args.balance_rel_threshold,
        prefix_ttl_s=args.prefix_ttl,
        heartbeat_interval_s=args.heartbeat_interval,
        heartbeat_timeout_s=args.heartbeat_timeout,
        max_pending_requests=args.max_pending,
        context_length=args.context_length,
    )


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    if not config.model_dir.is_dir():
        raise SystemExit(f"--model {config.model_dir}: not a directory")
    web.run_app(
        create_app(config),
        host=config.host,
        port=config.port,
        loop=_new_loop(),
        handler_cancellation=True,
        shutdown_timeout=5.0,
        print=lambda msg: logging.getLogger("router").info(msg),
    )


def _new_loop():
    try:
        import uvloop
    except ImportError:  # uvloop has no Windows build; the stock loop works, slower
        import asyncio

        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
