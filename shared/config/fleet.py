"""The fleet config file: one TOML file read by the router, the workers, launch-cluster and the
services. Sections [model] (or [[models]], several), [router], [worker], [cluster]; every key is
optional. The sections and their settings are declared in shared/config/sections.py, the
enumerations in shared/config/choices.py, the flags made from them in shared/config/flags.py.

    # A command with a --config flag: defaults < the file < the flags actually typed.
    args, config = load_with_flags(parser, argv, {"worker": {}, "model": {"model": "path"}})

    config = load_config(path)                      # FleetConfig, or ConfigError naming the key

Relative paths in the file are taken from the file's own folder. Unknown keys are errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from shared.config.choices import (
    COMPUTE_DTYPES,
    DEFAULT_MODEL_NAME,
    LOG_LEVELS,
    MODEL_ID_ENV,
    POLICY_NAMES,
    TOOL_CALL_PARSERS,
)
from shared.config.fields import ConfigError, describe
from shared.config.flags import checked, merge_flags, parse_with_passed
from shared.config.sections import (
    SECTIONS,
    ClusterSection,
    FleetConfig,
    ModelSection,
    RouterSection,
    Section,
    WorkerGroup,
    WorkerSection,
)

__all__ = [
    "COMPUTE_DTYPES",
    "DEFAULT_MODEL_NAME",
    "LOG_LEVELS",
    "MODEL_ID_ENV",
    "POLICY_NAMES",
    "TOOL_CALL_PARSERS",
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
    "read_key_budgets",
]


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
    _reject_unknown("", data, [*SECTIONS, "models", "workers"])
    sections = {}
    for name, cls in SECTIONS.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"[{name}]: expected a table of keys, got {describe(table)}")
        sections[name] = _section(name, cls, table, base_dir)
    config = FleetConfig(
        **sections, models=_models(data, base_dir), workers=_worker_groups(data, base_dir)
    )
    if problem := sections["model"].source_problem():
        raise ConfigError(f"[model]: {problem}")
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
    for i, model in enumerate(models):
        if problem := model.source_problem():
            raise ConfigError(f"models[{i}]: {problem}")
    if clash := name_clash(models):
        name, first, second = clash
        raise ConfigError(
            f"models[{second}]: the name '{name}' is already models[{first}]'s "
            "(set id to tell them apart)"
        )
    return models


def _worker_groups(data: Mapping[str, Any], base_dir: Path) -> tuple[WorkerGroup, ...]:
    """The [[workers]] array: launch-cluster's workers by role (role, count)."""
    tables = data.get("workers", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"workers: expected [[workers]] tables, got {describe(tables)}")
    return tuple(_section(f"workers[{i}]", WorkerGroup, t, base_dir) for i, t in enumerate(tables))


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
        key: checked(f"{name}.{key}", fields[key], raw, base_dir) for key, raw in table.items()
    }
    return cls(**values)


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
    return tuple(dict.fromkeys([*router.api_keys, *read_key_budgets(router)]))


KEY_BUDGET_NAMES = ("rpm", "tpm")  # a keys-file line: KEY [rpm=N] [tpm=N]


def read_key_budgets(router: RouterSection) -> dict[str, dict[str, int]]:
    """Each key of api_keys_file with the budgets its line sets (`KEY rpm=60 tpm=100000`;
    a bare `KEY`, the older format, sets none)."""
    if router.api_keys_file is None:
        return {}
    try:
        text = router.api_keys_file.read_text()
    except OSError as e:
        raise ConfigError(f"api_keys_file {router.api_keys_file}: {e.strerror}") from None
    keys: dict[str, dict[str, int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        key, *options = line.split("#", 1)[0].split() or [""]
        if key:
            keys[key] = _key_options(options, f"api_keys_file line {number}")
    return keys


def _key_options(options: list[str], where: str) -> dict[str, int]:
    budgets = {}
    for option in options:
        name, _, value = option.partition("=")
        if name not in KEY_BUDGET_NAMES or not value.isdigit() or int(value) < 1:
            raise ConfigError(
                f"{where}: expected KEY [rpm=N] [tpm=N] with N >= 1, got {option!r} after the key"
            )
        budgets[name] = int(value)
    return budgets


def too_open(path: Path) -> bool:
    """A secret file others than its owner may read (POSIX permissions only)."""
    return os.name == "posix" and bool(path.stat().st_mode & 0o077)
