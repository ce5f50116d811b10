"""Each setting is declared once (shared/config/sections.py), and every flag, TOML key and
runtime default comes from that declaration; the enumerations live in shared/config/choices.py
alone."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from fleet import launch
from router import cli as router_cli
from router.chat.tool_parsers import PARSER_NAMES, parse_tool_calls
from router.config import ModelSpec, RouterConfig
from router.routing.policy import make_policy
from shared.config import choices
from shared.config.fields import Expected
from shared.config.flags import flag_of
from shared.config.fleet import parse_config
from shared.config.sections import (
    SECTIONS,
    ClusterSection,
    ModelSection,
    RouterSection,
    WorkerSection,
    default_of,
    setting,
)
from worker import cli as worker_cli
from worker.config import EngineConfig

ROOT = Path(__file__).resolve().parents[3]


def options(parser) -> dict[str, str]:
    """Each option string of `parser` -> its dest."""
    return {s: a.dest for a in parser._actions for s in a.option_strings}


# Which command takes a flag for which declared setting (file-only keys: none).
ROUTER_TAKES = {f.name for f in dataclasses.fields(RouterSection)} - {"api_keys"}
WORKER_TAKES = {f.name for f in dataclasses.fields(WorkerSection)}
LAUNCH_TAKES = {"router": {"host", "port", "policy"}, "cluster": {"workers", "tp"}}
LAUNCH_TAKES["worker"] = set(launch.WORKER_FLAGS)


def test_every_setting_has_a_check_help_and_toml_key():
    for section_name, section in SECTIONS.items():
        for field in dataclasses.fields(section):
            assert callable(field.metadata["check"]) and field.metadata["help"], field.name
            if field.default not in (None, ()):  # the declared default reads back from TOML
                raw = str(field.default) if isinstance(field.default, Path) else field.default
                config = parse_config({section_name: {field.name: raw}})
                assert getattr(getattr(config, section_name), field.name) == field.default


@pytest.mark.parametrize(
    ("parser", "section", "names"),
    [
        (router_cli.build_parser, RouterSection, ROUTER_TAKES),
        (worker_cli.build_parser, WorkerSection, WORKER_TAKES),
        (worker_cli.build_parser, ModelSection, {"compute_dtype"}),
        (launch.build_parser, RouterSection, LAUNCH_TAKES["router"]),
        (launch.build_parser, ClusterSection, LAUNCH_TAKES["cluster"]),
        (launch.build_parser, WorkerSection, LAUNCH_TAKES["worker"]),
    ],
)
def test_each_command_has_the_declared_flag_for_each_setting(parser, section, names):
    flags = options(parser())
    for name in names:
        flag = flag_of(setting(section, name))
        assert flags.get(flag) == name, (flag, name)


def test_file_only_keys_have_no_flag():
    assert flag_of(setting(RouterSection, "api_keys")) is None
    assert "--api-keys" not in options(router_cli.build_parser())


def test_old_flag_spellings_stay():
    flags = options(router_cli.build_parser())
    for flag in ("--prefix-ttl", "--heartbeat-interval", "--heartbeat-timeout", "--max-pending"):
        assert flag in flags
    assert "--tp-timeout-s" in options(worker_cli.build_parser())


def test_router_defaults_flags_file_and_runtime_agree():
    parser = router_cli.build_parser()
    from_file = parse_config({}).router
    runtime = RouterConfig.from_section(from_file, models=(ModelSpec(Path(".")),))
    for name in ROUTER_TAKES:
        declared = setting(RouterSection, name).default
        assert parser.get_default(name) == declared, name
        assert getattr(from_file, name) == getattr(runtime, name) == declared, name


def test_engine_defaults_come_from_the_worker_declarations():
    engine = EngineConfig()
    pairs = {"block_size": "block_size", "max_running": "max_running"}
    pairs |= {"prefill_chunk": "prefill_chunk", "kv_memory_fraction": "kv_fraction"}
    pairs |= {"attention_backend": "attention_backend", "speculative": "speculative"}
    pairs |= {"kv_memory_bytes": "kv_memory", "kv_disk_bytes": "kv_disk"}
    for engine_name, worker_name in pairs.items():
        assert getattr(engine, engine_name) == default_of(WorkerSection, worker_name)
    assert engine.compute_dtype == default_of(ModelSection, "compute_dtype")
    # a worker started with nothing set runs the engine defaults
    section = parse_config({})
    assert worker_cli.engine_config(section.worker, section.model) == engine


def test_a_changed_declaration_changes_the_flags(monkeypatch):
    """The flags read the declaration when the parser is built: change it, they follow."""
    monkeypatch.setattr(setting(RouterSection, "port"), "default", 9123)
    assert router_cli.build_parser().get_default("port") == 9123
    max_running = setting(WorkerSection, "max_running")
    patched = {**max_running.metadata, "unset": 77}
    monkeypatch.setattr(max_running, "metadata", patched)
    for build in (worker_cli.build_parser, launch.build_parser):
        assert "(default 77)" in re.sub(r"\s+", " ", build().format_help())


def test_flag_values_are_checked_like_the_file():
    with pytest.raises(SystemExit):  # parser.error names the flag and what was expected
        worker_cli.load_settings(worker_cli.build_parser(), ["--block-size", "0"])
    args, worker, _ = worker_cli.load_settings(
        worker_cli.build_parser(), ["--tp-hosts", "a,b", "--tp-rank", "1", "--log-level", "debug"]
    )
    assert (worker.tp_hosts, worker.tp_rank, worker.log_level) == (("a", "b"), 1, "DEBUG")


def test_launch_forwards_what_the_worker_takes():
    worker_flags = options(worker_cli.build_parser())
    launch_flags = options(launch.build_parser())
    for name in launch.WORKER_FLAGS:
        flag = flag_of(setting(WorkerSection, name))
        assert launch_flags[flag] == worker_flags[flag] == name


# ------------------------------------------------------------ one source per enumeration


def test_policy_factory_builds_exactly_the_declared_names():
    for name in choices.POLICY_NAMES:
        make_policy(name)
    with pytest.raises(ValueError):
        make_policy("random")


def test_tool_call_parsers_are_the_declared_ones():
    assert PARSER_NAMES == choices.TOOL_CALL_PARSERS
    for name in choices.TOOL_CALL_PARSERS:
        parse_tool_calls(name, "plain text")


def test_attention_backends_are_the_declared_ones():
    from worker.attention.paged import BACKENDS

    assert {"auto", *BACKENDS} == set(choices.ATTENTION_BACKENDS)


def test_block_size_default_is_the_declared_one():
    from worker.kv.block_pool import DEFAULT_BLOCK_SIZE

    assert DEFAULT_BLOCK_SIZE == choices.DEFAULT_BLOCK_SIZE == EngineConfig().block_size


def test_speculative_modes_are_checked_from_the_declaration():
    for mode in choices.SPECULATIVE_MODES:
        EngineConfig(speculative=mode).validate()
    with pytest.raises(ValueError, match="'off' or 'ngram'"):
        EngineConfig(speculative="medusa").validate()
    with pytest.raises(Expected):
        setting(WorkerSection, "speculative").metadata["check"]("medusa", Path("."))


LITERALS = [
    '"cache_aware", "round_robin", "least_load"',
    '"hermes", "llama3", "mistral"',
    '"auto", "metal", "mlx"',
    '"off", "ngram"',
    ".cache/mlx-fleet/kv",
    '".cache" / "mlx-fleet"',
]


def test_no_code_repeats_an_enumeration_or_the_disk_dir():
    """The literals appear in shared/config/choices.py only (tests and docs may quote them)."""
    source = ROOT / "shared/config/choices.py"
    for folder in ("router", "worker", "shared", "fleet", "deploy"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == source:
                continue
            text = path.read_text()
            for literal in LITERALS:
                assert literal not in text, f"{path.relative_to(ROOT)} repeats {literal}"
