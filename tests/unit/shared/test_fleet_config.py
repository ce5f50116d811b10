"""The fleet config file: typed sections, errors that name the key, flags over the file."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from router.cli import parse_args
from router.config import ModelSpec, RouterConfig
from router.routing.policy import POLICY_NAMES
from shared.config import fleet as fleet_config
from shared.config.fleet import (
    ConfigError,
    RouterSection,
    load_config,
    merge_flags,
    parse_config,
    parse_with_passed,
    read_api_keys,
)
from tests.support.paths import ROOT

EXAMPLE = """
[model]
path = "/models/SmolLM2"
compute_dtype = "float32"

[router]
host = "0.0.0.0"
port = 8100
zmq_bind = "tcp://0.0.0.0:5555"
api_keys_file = "secrets/api_keys"
max_body_bytes = "1MiB"
max_tokens_cap = 512
per_key_concurrency = 4
curve_secret_key = "curve/router.key_secret"
curve_authorized_keys = "curve/authorized_workers"

[worker]
router = "tcp://studio.local:5555"
kv_memory = "8GiB"
block_size = 16
curve_secret_key = "~/fleet/worker.key_secret"
curve_server_key = "curve/router.key"

[cluster]
workers = 3
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def test_example_file_loads_typed_values_and_resolves_paths(tmp_path):
    config = load_config(write(tmp_path, EXAMPLE))
    assert config.model.path == "/models/SmolLM2" and config.model.compute_dtype == "float32"
    assert (config.router.port, config.router.max_body_bytes) == (8100, 2**20)
    assert config.router.api_keys_file == tmp_path.resolve() / "secrets/api_keys"
    assert config.router.curve_enabled and config.worker.curve_enabled
    assert config.worker.curve_secret_key == Path.home().resolve() / "fleet/worker.key_secret"
    assert config.worker.kv_memory == 8 * 2**30 and config.worker.max_running is None
    assert config.cluster.workers == 3
    assert config.source == (tmp_path / "fleet.toml").resolve()


def test_empty_file_is_all_defaults(tmp_path):
    config = load_config(write(tmp_path, ""))
    assert config.router == RouterSection() and config.router.host == "127.0.0.1"
    assert not config.router.curve_enabled


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[router]\nport = "abc"', 'router.port: expected an integer 1-65535, got "abc"'),
        ("[router]\nport = 70000", "router.port: expected an integer 1-65535, got 70000"),
        (
            '[router]\npolicy = "random"',
            "router.policy: expected one of cache_aware, round_robin",
        ),
        ("[router]\nprot = 1", 'router.prot: unknown key (did you mean "port"?)'),
        ("[routr]\nport = 1", 'routr: unknown section (did you mean "router"?)'),
        ('[worker]\nkv_memory = "lots"', "worker.kv_memory: expected a size in bytes"),
        ("[worker]\nkv_fraction = 1.5", "worker.kv_fraction: expected a number > 0 and <= 1"),
        ('[worker]\nrouter = "studio:5555"', "worker.router: expected a ZeroMQ address"),
        ("[router]\napi_keys = [1]", "router.api_keys: expected a list of non-empty strings"),
        ("router = 5", "[router]: expected a table of keys, got 5"),
        ('[router]\ncurve_secret_key = "a"', "set both (CURVE on) or neither"),
        ("[worker]\nkv_memory = 10\nkv_fraction = 0.5", "set one, not both"),
        ("[router\n", "not valid TOML"),
    ],
)
def test_bad_values_name_the_key_and_what_was_expected(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert message in str(err.value)
    assert str(tmp_path) in str(err.value)  # and the file


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "nope.toml")


def test_policy_names_agree_with_the_router():
    assert fleet_config.POLICY_NAMES == POLICY_NAMES


def test_router_section_defaults_agree_with_router_config():
    defaults = RouterConfig(models=(ModelSpec(Path(".")),))
    for f in dataclasses.fields(RouterSection):
        if hasattr(defaults, f.name):
            assert getattr(defaults, f.name) == f.default, f.name


# ------------------------------------------------------------ flags over the file


def small_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--max-pending", type=int, default=1024)
    p.add_argument("--config")
    return p


def test_only_typed_flags_count_as_passed():
    args, passed = parse_with_passed(small_parser(), ["--port", "8000", "--config", "x"])
    assert passed == {"port", "config"}
    assert args.host == "127.0.0.1"  # the default still fills args


def test_passed_flags_win_over_the_file_and_the_rest_keeps_the_file():
    section = parse_config({"router": {"port": 9000, "host": "0.0.0.0"}}).router
    args, passed = parse_with_passed(small_parser(), ["--port", "8000", "--max-pending", "3"])
    merged = merge_flags(section, args, passed, {"max_pending": "max_pending_requests"})
    assert merged.port == 8000  # typed, even though it equals the default
    assert merged.host == "0.0.0.0"  # not typed: the file's value, not argparse's default
    assert merged.max_pending_requests == 3


def test_bad_flag_value_is_named_as_the_flag():
    args, passed = parse_with_passed(small_parser(), ["--port", "0"])
    with pytest.raises(ConfigError, match="--port: expected an integer 1-65535, got 0"):
        merge_flags(RouterSection(), args, passed)


def test_api_keys_come_from_the_file_and_the_keys_file(tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text("# laptop\nkey-b\n\nkey-c  # ci\nkey-a\n")
    section = parse_config(
        {"router": {"api_keys": ["key-a"], "api_keys_file": str(keys_file)}}
    ).router
    assert read_api_keys(section) == ("key-a", "key-b", "key-c")
    assert "key-a" not in repr(section)  # never printed by accident


def test_router_command_line_reads_the_config_and_flags_win(tmp_path):
    (tmp_path / "keys").write_text("secret-1\n")
    path = write(
        tmp_path,
        '[model]\npath = "/m/Smol"\nid = "smol"\n'
        '[router]\nport = 9100\npolicy = "round_robin"\napi_keys_file = "keys"\n'
        "max_tokens_cap = 64\nper_key_concurrency = 2\n",
    )
    config = parse_args(["--config", str(path), "--policy", "least_load"])
    assert config.models == (ModelSpec(Path("/m/Smol"), "smol"),)
    assert (config.port, config.policy) == (9100, "least_load")
    assert config.api_keys == ("secret-1",)
    assert (config.max_tokens_cap, config.per_key_concurrency) == (64, 2)
    assert "secret-1" not in repr(config)


def test_router_command_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit, match="router.port"):
        parse_args(["--config", str(write(tmp_path, '[model]\npath="/m"\n[router]\nport="x"'))])
    with pytest.raises(SystemExit):
        parse_args([])  # no model anywhere
    assert "--model is required" in capsys.readouterr().err


def test_the_shipped_example_loads():
    example = ROOT / "deploy" / "fleet.example.toml"
    config = load_config(example)
    assert config.router.curve_enabled and config.worker.curve_enabled
    assert config.router.max_body_bytes == 48 * 2**20 and config.worker.kv_fraction == 0.5


def test_every_key_is_documented():
    doc = (ROOT / "docs" / "deploy.md").read_text()
    for name, cls in fleet_config.SECTIONS.items():
        assert f"`[{name}]`" in doc
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in doc, f"{name}.{f.name} is missing from docs/deploy.md"


def worker_like_parser() -> argparse.ArgumentParser:
    """The shape the worker CLI takes: its flags named like [worker] / [model] keys."""
    p = argparse.ArgumentParser()
    p.add_argument("--config", type=Path)
    p.add_argument("--router", default="tcp://127.0.0.1:5555")
    p.add_argument("--model")
    p.add_argument("--kv-memory")
    p.add_argument("--block-size", type=int)
    p.add_argument("--curve-secret-key", type=Path)
    p.add_argument("--curve-server-key", type=Path)
    return p


def test_load_with_flags_for_a_worker_command_line(tmp_path):
    path = write(
        tmp_path,
        '[model]\npath = "/m/a"\n[worker]\nrouter = "tcp://10.0.0.2:5555"\nblock_size = 32\n'
        'curve_secret_key = "k/w.key_secret"\ncurve_server_key = "k/router.key"\n',
    )
    argv = ["--config", str(path), "--kv-memory", "2GiB", "--model", "/m/b"]
    args, config = fleet_config.load_with_flags(
        worker_like_parser(), argv, {"worker": {}, "model": {"model": "path"}}
    )
    assert config.worker.router == ("tcp://10.0.0.2:5555",)  # the file's, not argparse's default
    assert (config.worker.block_size, config.worker.kv_memory) == (32, 2 * 2**30)
    assert config.model.path == "/m/b"  # the flag wins
    assert config.worker.curve_server_key == tmp_path.resolve() / "k/router.key"
    assert args.config == path


def test_load_with_flags_without_a_file_and_pair_errors():
    _, config = fleet_config.load_with_flags(worker_like_parser(), [], {"worker": {}})
    assert config.worker == fleet_config.WorkerSection()
    with pytest.raises(ConfigError, match="set both"):
        fleet_config.load_with_flags(
            worker_like_parser(), ["--curve-secret-key", "w.key_secret"], {"worker": {}}
        )
