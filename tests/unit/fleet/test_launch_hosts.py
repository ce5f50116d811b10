"""launch-cluster --hosts N: the routers plus N host agents (host-0 ...), each with its
budget, connected to every router; without --hosts nothing changes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet.host.memory import default_budget
from fleet.launch import build_parser, free_port
from fleet.launch_hosts import agent_commands, host_budget
from tests.support.paths import ROOT


def test_agent_commands_name_the_hosts_and_their_budget():
    args = build_parser().parse_args(
        ["--config", "f.toml", "--hosts", "2", "--host-memory", "3GiB", "--log-dir", "/l"]
    )
    endpoints = ["tcp://127.0.0.1:6000", "tcp://127.0.0.1:6001"]
    cmds = agent_commands(args, endpoints, host_budget(args))
    assert [c[c.index("--host-id") + 1] for c in cmds] == ["host-0", "host-1"]
    for cmd in cmds:
        assert cmd[:3] == [sys.executable, "-m", "fleet.host"]
        assert cmd[cmd.index("--memory-budget") + 1] == str(3 << 30)
        assert [cmd[i + 1] for i, x in enumerate(cmd) if x == "--router"] == endpoints
        assert cmd[cmd.index("--log-dir") + 1] == str(Path("/l/workers"))
    shared = build_parser().parse_args(["--config", "f.toml", "--hosts", "4"])
    assert host_budget(shared) == default_budget() // 4
    assert build_parser().parse_args([]).hosts is None  # launch-cluster as before


def test_hosts_needs_a_config():
    with pytest.raises(SystemExit):
        from fleet.launch import main

        main(["--hosts", "2"])


def children_of(pid: int) -> list[list[str]]:
    cmds = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if entry.name.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                cmds.append((entry / "cmdline").read_bytes().decode().split("\0"))
        except (OSError, ValueError):
            continue
    return cmds


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_launch_cluster_with_hosts_starts_routers_and_agents(tmp_path, default_model_dir):
    config = tmp_path / "fleet.toml"
    config.write_text(f'[[models]]\nid = "smol"\npath = "{default_model_dir}"\n')
    port = free_port()
    cmd = [sys.executable, "-m", "fleet.launch", "--config", str(config), "--hosts", "2"]
    cmd += ["--host-memory", "2GiB", "--port", str(port), "--log-dir", str(tmp_path / "logs")]
    launcher = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = launcher.stdout.readline()
        assert "mlx-fleet is serving smol" in line and "2 host agents of 2.00 GiB" in line
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            agents = [c for c in children_of(launcher.pid) if "fleet.host" in c]
            if len(agents) == 2:
                break
            time.sleep(0.2)
        assert sorted(c[c.index("--host-id") + 1] for c in agents) == ["host-0", "host-1"]
        assert (tmp_path / "logs" / "host-0.log").exists()
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--tp", "2"], "tensor-parallel"),
        (["--workers", "2"], "min_workers / max_workers"),
        (["--prefill-workers", "1"], "min_workers / max_workers"),
    ],
)
def test_hosts_refuses_what_it_would_ignore(tmp_path, capsys, flags, says):
    from fleet.launch import main

    config = tmp_path / "fleet.toml"
    config.write_text('[[models]]\nid = "m"\npath = "/nowhere"\n')
    with pytest.raises(SystemExit):
        main(["--config", str(config), "--hosts", "2", *flags])
    assert says in capsys.readouterr().err
