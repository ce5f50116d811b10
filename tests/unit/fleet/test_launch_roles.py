"""launch-cluster's worker roles: --prefill-workers, [[workers]] in the fleet config."""

from __future__ import annotations

import pytest

from fleet.launch import build_parser, commands, served_models
from shared.config.fields import ConfigError
from shared.config.fleet import load_with_flags, parse_config
from tests.support.tiny_model import build_tiny_model


def roles_of(workers: list[list[str]]) -> list[str]:
    return [w[w.index("--role") + 1] if "--role" in w else "both" for w in workers]


def launch(argv: list[str]) -> list[list[str]]:
    args, fleet = load_with_flags(build_parser(), argv, {"cluster": {}})
    models = served_models(args, fleet)
    return commands(args, fleet, models, 5999)[1]


def test_prefill_workers_prefill_for_decode_workers(tmp_path):
    model = build_tiny_model(tmp_path / "m")
    workers = launch(["--model", str(model), "--prefill-workers", "1", "--workers", "2"])
    assert roles_of(workers) == ["prefill", "decode", "decode"]
    assert all("--role" not in w for w in launch(["--model", str(model), "--workers", "2"]))


def test_workers_tables_set_the_roles(tmp_path):
    model = build_tiny_model(tmp_path / "m")
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[model]\npath = "{model}"\n'
        '[[workers]]\nrole = "prefill"\n'
        '[[workers]]\nrole = "decode"\ncount = 2\n'
    )
    assert roles_of(launch(["--config", str(path)])) == ["prefill", "decode", "decode"]


def test_a_bad_role_is_refused():
    with pytest.raises(ConfigError, match=r"workers\[0\]\.role"):
        parse_config({"workers": [{"role": "sometimes"}]})
    with pytest.raises(ConfigError, match=r"worker\.role"):
        parse_config({"worker": {"role": "sometimes"}})


def test_kv_pulls_off_reaches_the_router(tmp_path):
    model = build_tiny_model(tmp_path / "m")

    def router_of(argv: list[str]) -> list[str]:
        args, fleet = load_with_flags(build_parser(), argv, {"router": {}, "cluster": {}})
        return commands(args, fleet, served_models(args, fleet), 5999)[0][0]

    assert "--kv-pulls" not in router_of(["--model", str(model)])
    off = router_of(["--model", str(model), "--kv-pulls", "false"])
    assert off[off.index("--kv-pulls") + 1] == "false"


def test_two_routers_on_ports_in_sequence_each_serve_every_worker(tmp_path):
    model = build_tiny_model(tmp_path / "m")
    argv = ["--model", str(model), "--workers", "2", "--routers", "2", "--port", "8100"]
    args, fleet = load_with_flags(build_parser(), argv, {"router": {}, "cluster": {}})
    routers, workers = commands(args, fleet, served_models(args, fleet), 5999)

    def values(cmd: list[str], flag: str) -> list[str]:
        return [cmd[i + 1] for i, word in enumerate(cmd) if word == flag]

    assert [values(r, "--port") for r in routers] == [["8100"], ["8101"]]
    zmq = [values(r, "--zmq-bind") for r in routers]
    assert zmq == [["tcp://127.0.0.1:5999"], ["tcp://127.0.0.1:6000"]]
    assert [values(w, "--router") for w in workers] == [[z for [z] in zmq]] * 2
    path = tmp_path / "fleet.toml"  # the file's [cluster] routers, and free ZeroMQ ports
    path.write_text(f'[model]\npath = "{model}"\n[cluster]\nrouters = 3\n')
    args, fleet = load_with_flags(build_parser(), ["--config", str(path)], {"cluster": {}})
    routers, _ = commands(args, fleet, served_models(args, fleet), [7001, 7005, 7003])
    assert [values(r, "--zmq-bind") for r in routers] == [
        [f"tcp://127.0.0.1:{p}"] for p in (7001, 7005, 7003)
    ]
