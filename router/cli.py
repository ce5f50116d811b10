"""Command line: run the router (`python -m router --config FILE` or `--model DIR ...`)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path

from aiohttp import web

from router.app import create_app
from router.config import ModelSpec, RouterConfig
from router.http.access_log import AccessLogger
from router.http.api_keys import key_fingerprint
from router.store import backend_of
from router.text.tokenizer import read_chat_template
from shared.config.flags import add_flags
from shared.config.fleet import (
    ConfigError,
    ModelSection,
    RouterSection,
    load_with_flags,
    name_clash,
    read_api_keys,
    read_key_budgets,
)
from shared.curve import CurveError, load_secret, require_curve
from shared.parent_watch import watch_parent

log = logging.getLogger("router")

# [router] settings with a flag, in --help order; the security ones get their own group.
ROUTER_FLAGS = (
    "host",
    "port",
    "zmq_bind",
    "policy",
    "prefill_weight",
    "balance_abs_threshold",
    "balance_rel_threshold",
    "kv_pulls",
    "prefill_timeout_s",
    "prefill_min_tokens",
    "prefix_ttl_s",
    "heartbeat_interval_s",
    "heartbeat_timeout_s",
    "wedged_after_s",
    "max_pending_requests",
    "tokenizer_threads",
    "context_length",
    "tool_call_parser",
    "reasoning_parser",
    "chat_template",
    "volatile_prompt_patterns",
    "state_url",
    "placement_lease_s",
    "responses_store",
    "responses_store_path",
    "responses_store_size",
    "responses_store_bytes",
    "responses_store_ttl_s",
    "batch_file_max_bytes",
    "batch_file_max_lines",
    "batch_lines_per_worker",
    "batch_yield_s",
    "load_timeout_s",
    "worker_wait_s",
)
SECURITY_FLAGS = (
    "api_keys_file",
    "max_body_bytes",
    "max_tokens_cap",
    "per_key_concurrency",
    "key_rpm",
    "key_tpm",
    "curve_secret_key",
    "curve_authorized_keys",
    "admin_keys",
)
IMAGE_FLAGS = (
    "max_images",
    "max_image_bytes",
    "max_request_image_bytes",
    "max_image_pixels",
    "image_fetch",
    "image_fetch_timeout_s",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m router",
        description="mlx-fleet router: an OpenAI-compatible HTTP API in front of MLX workers, "
        "routing each prompt to the worker most likely to hold its prefix in cache. "
        "Flags override the --config file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--config", type=Path, metavar="FILE", help="fleet config file (TOML)")
    p.add_argument(
        "--model",
        metavar="DIR",
        action="append",
        help="model directory (tokenizer files, chat template, config.json), or a .gguf file "
        "or repo id the workers use too; repeat it to serve several models (each worker "
        "registers the one it serves); default: [model] / [[models]] in --config",
    )
    p.add_argument(
        "--model-id",
        metavar="NAME[,ALIAS...]",
        action="append",
        help="the name clients send for each --model in turn (or each model of --config), "
        "then other names accepted for it (default: the directory's name)",
    )
    add_flags(p, RouterSection, ROUTER_FLAGS, parser_defaults=True)
    security = p.add_argument_group("security (see docs/deploy.md)")
    add_flags(security, RouterSection, SECURITY_FLAGS, parser_defaults=True)
    images = p.add_argument_group("images in prompts (see docs/api.md, Images)")
    add_flags(images, RouterSection, IMAGE_FLAGS, parser_defaults=True)
    add_flags(
        p, RouterSection, ["log_level", "log_requests", "otlp_endpoint"], parser_defaults=True
    )
    return p


def parse_args(argv: list[str] | None) -> RouterConfig:
    """Defaults, then the --config file, then the flags actually typed; exits on bad values."""
    parser = build_parser()
    try:
        args, fleet = load_with_flags(parser, argv, {"router": {}})
        api_keys = read_api_keys(fleet.router)
        key_budgets = read_key_budgets(fleet.router)
        if not args.model and any(m.path is None and m.source is None for m in fleet.served_models):
            parser.error("--model is required (or set [model] path in the --config file)")
        models = model_specs(args, fleet)
        backend_of(fleet.router)  # redis needs a state_url
    except ConfigError as e:
        raise SystemExit(f"router: {e}") from None
    router = fleet.router
    logging.basicConfig(
        level=router.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return RouterConfig.from_section(
        router,
        models=models,
        api_keys=api_keys,
        key_budgets=key_budgets,
        chat_template=_chat_template(router.chat_template),
    )


def model_specs(args: argparse.Namespace, fleet) -> tuple[ModelSpec, ...]:
    """The served models: the --model flags, else the config's [model] or [[models]]; each
    named by the --model-id in the same place (NAME,ALIAS,...), else by its config or path."""
    if args.model:
        sections = [ModelSection(path=p) for p in args.model]
        source = "--model"
    else:
        sections = list(fleet.served_models)
        source = "[[models]]" if fleet.models else "[model]"
    names = args.model_id or []
    if names and len(names) != len(sections):
        raise ConfigError(
            f"--model-id given {len(names)} times for {len(sections)} models of {source}: "
            "give one per model, in the same order"
        )
    for i, given in enumerate(names):
        id_, *aliases = [n.strip() for n in given.split(",")]
        if not id_ or not all(aliases):
            raise ConfigError(f"--model-id {given!r}: expected NAME or NAME,ALIAS,...")
        # a --model named like a [[models]] entry of the config takes its catalog keys
        listed = next((m for m in fleet.models if m.name == id_), sections[i])
        sections[i] = dataclasses.replace(
            listed, path=sections[i].path, id=id_, aliases=tuple(aliases)
        )
    if clash := name_clash(sections):
        name, first, second = clash
        raise ConfigError(
            f"the name '{name}' is given to two models "
            f"({sections[first].name} and {sections[second].name})"
        )
    return tuple(
        ModelSpec(
            Path(m.path or m.source).expanduser(),
            m.name,
            tuple(m.aliases),
            m.tool_call_parser,
            m.reasoning_parser,
            m.task,
            m,
        )
        for m in sections
    )


def _chat_template(file_or_text: str | None) -> str | None:
    if file_or_text is None:
        return None
    try:
        return read_chat_template(file_or_text)
    except (OSError, ValueError) as e:
        raise SystemExit(f"router: {e}") from None


def check_security(config: RouterConfig) -> None:
    """Refuse plain ZeroMQ beyond loopback; warn about an open HTTP API beyond loopback."""
    try:
        require_curve(config.zmq_bind, config.curve_enabled, "--zmq-bind")
        if config.curve_enabled:  # fail here with a clear line, not in the app's startup
            load_secret(config.curve_secret_key)
            if not config.curve_authorized_keys.is_dir():
                raise CurveError(f"{config.curve_authorized_keys}: no such folder of worker keys")
    except CurveError as e:
        raise SystemExit(f"router: {e}") from None
    if config.api_keys:
        names = ", ".join(key_fingerprint(k) for k in config.api_keys)
        log.info("API keys required (%d: fingerprints %s)", len(config.api_keys), names)
    elif config.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "HTTP API on %s without API keys: anyone who can reach it can use it", config.host
        )


def resolve_model_dirs(config: RouterConfig) -> RouterConfig:
    """A .gguf file or repo id becomes the local directory it converts / downloads to; a Hub
    `source` the directory of its config and tokenizer (the host agents fetch its weights)."""
    from shared.models.store import (
        ModelNotFound,
        resolve_metadata,
        resolve_model,
        stderr_progress,
    )
    from shared.placement.footprint import weight_bytes as weight_bytes_of

    specs = []
    for spec in config.models:
        if spec.section.source is not None:
            try:
                path, weight_bytes = resolve_metadata(spec.section, stderr_progress)
            except ModelNotFound as e:
                raise SystemExit(f"router: model {spec.served_id}: {e}") from None
            if weight_bytes is None and spec.section.memory is None and not weight_bytes_of(path):
                raise SystemExit(
                    f"router: model {spec.served_id}: offline, the size of its weights is "
                    "unknown: set its memory in [[models]] (or let the router reach the Hub)"
                )
            spec = dataclasses.replace(spec, path=path, hub_weight_bytes=weight_bytes)
        elif not spec.path.is_dir():
            try:
                spec = dataclasses.replace(
                    spec, path=resolve_model(str(spec.path), stderr_progress)
                )
            except ModelNotFound as e:
                raise SystemExit(f"router: --model {spec.path}: {e}") from None
        specs.append(spec)
    return dataclasses.replace(config, models=tuple(specs))


def check_embedding_models(config: RouterConfig) -> None:
    """An embedding model whose pipeline is not served stops the router in one line, before
    the app starts (the app reads the same spec again: shared/models/embedding.py)."""
    from shared.models.embedding import NotServable, embedding_spec

    for spec in config.models:
        try:
            embedding_spec(spec.path, spec.task)
        except NotServable as e:
            raise SystemExit(f"router: model {spec.served_id}: {e}") from None


def main(argv: list[str] | None = None) -> None:
    # transformers warns at import that PyTorch is missing: the router needs only its tokenizers
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    config = parse_args(argv)
    check_security(config)
    config = resolve_model_dirs(config)
    check_embedding_models(config)
    watch_parent()  # started by launch-cluster: go when it goes (macOS has no PDEATHSIG)
    web.run_app(
        create_app(config),
        host=config.host,
        port=config.port,
        loop=_new_loop(),
        handler_cancellation=True,
        shutdown_timeout=5.0,
        access_log_class=AccessLogger,  # polls at DEBUG; --log-requests: JSON lines
        print=lambda msg: log.info(msg.splitlines()[0].strip("= ")),  # "Running on URL"
    )


def _new_loop():
    try:
        import uvloop
    except ImportError:  # uvloop has no Windows build; the stock loop works, slower
        import asyncio

        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
