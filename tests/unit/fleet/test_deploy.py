"""Service files render for this user and install path, and parse; install-service never runs
launchctl / systemctl in a dry run."""

from __future__ import annotations

import dataclasses
import os
import plistlib
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from deploy import install as install_cli
from deploy import services
from tests.support.paths import ROOT

ODD = "/Users/Ann Lee/fleet & co <1>/100%"  # spaces, XML specials, a systemd specifier


def make_install(base: str = "/opt/fleet", env=None) -> services.Install:
    return services.Install(
        root=Path(base),
        venv=Path(base) / ".venv",
        config=Path(base) / "fleet.toml",
        log_dir=Path(base) / "logs",
        env=env or {},
        hostname="studio",
    )


def test_router_plist(tmp_path):
    [file] = services.render_launchd("router", make_install(env={"OPENBLAS_NUM_THREADS": "2"}))
    plist = plistlib.loads(file.text.encode())
    assert file.name == "com.mlx-fleet.router.plist" and plist["Label"] == file.label
    assert plist["ProgramArguments"] == [
        "/opt/fleet/.venv/bin/python",
        "-m",
        "router",
        "--config",
        "/opt/fleet/fleet.toml",
    ]
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] is True
    assert plist["WorkingDirectory"] == "/opt/fleet"
    assert plist["StandardOutPath"] == plist["StandardErrorPath"] == "/opt/fleet/logs/router.log"
    assert plist["EnvironmentVariables"]["PATH"].startswith("/opt/fleet/.venv/bin:")
    assert plist["EnvironmentVariables"]["OPENBLAS_NUM_THREADS"] == "2"
    _lint(tmp_path, file)


def test_one_worker_plist_per_process(tmp_path):
    files = services.render_launchd("worker", make_install(), workers=3)
    plists = [plistlib.loads(f.text.encode()) for f in files]
    assert [p["Label"] for p in plists] == [f"com.mlx-fleet.worker.{n}" for n in (1, 2, 3)]
    assert plists[1]["ProgramArguments"] == [
        "/opt/fleet/.venv/bin/cluster-worker",
        "--config",
        "/opt/fleet/fleet.toml",
        "--worker-id",
        "studio-2",
    ]
    assert plists[2]["StandardOutPath"] == "/opt/fleet/logs/worker-3.log"
    assert all(p["KeepAlive"] and p["RunAtLoad"] for p in plists)
    for file in files:
        _lint(tmp_path, file)


def test_plist_survives_odd_paths():
    [file] = services.render_launchd("router", make_install(ODD, env={"NOTE": "a<b & c"}))
    plist = plistlib.loads(file.text.encode())
    assert plist["ProgramArguments"][-1] == f"{ODD}/fleet.toml"
    assert plist["EnvironmentVariables"]["NOTE"] == "a<b & c"


def _lint(tmp_path: Path, file: services.ServiceFile) -> None:
    """plutil -lint where it exists (macOS)."""
    if shutil.which("plutil") is None:
        return
    path = tmp_path / file.name
    path.write_text(file.text)
    subprocess.run(["plutil", "-lint", str(path)], check=True, capture_output=True)


# ------------------------------------------------------------ systemd


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file: sections of key -> values (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"a setting outside any section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {line}"
        current.setdefault(key, []).append(value)
    return sections


def exec_words(value: str) -> list[str]:
    """ExecStart= as systemd splits it, with %% and $$ turned back into % and $."""
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(value)]


def test_router_unit():
    unit = parse_unit(services.render_systemd("router", make_install(env={"X": "1"})).text)
    assert set(unit) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    assert exec_words(service["ExecStart"][0]) == [
        "/opt/fleet/.venv/bin/python",
        "-m",
        "router",
        "--config",
        "/opt/fleet/fleet.toml",
    ]
    assert service["Restart"] == ["always"] and service["WorkingDirectory"] == ["/opt/fleet"]
    assert service["Environment"] == ["PYTHONUNBUFFERED=1", "X=1"]
    assert unit["Install"]["WantedBy"] == ["default.target"]


def test_worker_unit_is_a_template_with_odd_paths_escaped():
    file = services.render_systemd("worker", make_install(ODD, env={"NOTE": "50% of $HOME"}))
    assert file.name == "mlx-fleet-worker@.service"
    service = parse_unit(file.text)["Service"]
    assert exec_words(service["ExecStart"][0]) == [
        f"{ODD}/.venv/bin/cluster-worker",
        "--config",
        f"{ODD}/fleet.toml",
        "--worker-id",
        "%H-%i",  # systemd's own specifiers stay: host name and instance
    ]
    assert service["WorkingDirectory"] == [ODD.replace("%", "%%")]
    assert service["Environment"][1] == '"NOTE=50%% of $HOME"'
    assert services.systemd_units("worker", 2) == [
        "mlx-fleet-worker@1.service",
        "mlx-fleet-worker@2.service",
    ]


# ------------------------------------------------------------ install-service


@pytest.fixture
def no_subprocess(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(subprocess, "run", refuse)


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text('[model]\npath = "/m"\n[worker]\nrouter = "tcp://127.0.0.1:5555"\n')
    return path


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = install_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_writes_into_out_and_prints_the_commands(
    tmp_path, capsys, config_file, no_subprocess
):
    out_dir = tmp_path / "agents"
    code, out, _ = run_cli(
        capsys,
        "install",
        "worker",
        "--launchd",
        "--workers",
        "2",
        "--config",
        str(config_file),
        "--dry-run",
        "--out",
        str(out_dir),
        "--log-dir",
        str(tmp_path / "logs"),
    )
    assert code == 0
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "com.mlx-fleet.worker.1.plist",
        "com.mlx-fleet.worker.2.plist",
    ]
    plist = plistlib.loads((out_dir / "com.mlx-fleet.worker.1.plist").read_bytes())
    assert plist["ProgramArguments"][1:3] == ["--config", str(config_file)]
    uid = os.getuid()
    assert f"$ launchctl bootstrap gui/{uid} {out_dir}/com.mlx-fleet.worker.2.plist" in out

    # A later install with fewer workers unloads and removes the extra one.
    code, out, _ = run_cli(
        capsys,
        "install",
        "worker",
        "--launchd",
        "--workers",
        "1",
        "--config",
        str(config_file),
        "--dry-run",
        "--out",
        str(out_dir),
    )
    assert f"$ launchctl bootout gui/{uid}/com.mlx-fleet.worker.2" in out
    assert f"# remove {out_dir}/com.mlx-fleet.worker.2.plist" in out

    code, out, _ = run_cli(
        capsys, "status", "worker", "--launchd", "--out", str(out_dir), "--dry-run"
    )
    assert f"$ launchctl print gui/{uid}/com.mlx-fleet.worker.1" in out


def test_dry_run_without_out_writes_nothing(
    tmp_path, capsys, config_file, no_subprocess, monkeypatch
):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    code, out, _ = run_cli(
        capsys, "install", "router", "--systemd", "--config", str(config_file), "--dry-run"
    )
    assert code == 0 and not (tmp_path / "xdg").exists()
    assert "ExecStart=" in out
    assert "$ systemctl --user enable --now mlx-fleet-router.service" in out


def test_install_refuses_a_config_that_would_not_start(tmp_path, capsys, no_subprocess):
    bad = tmp_path / "fleet.toml"
    bad.write_text('[router]\nzmq_bind = "tcp://0.0.0.0:5555"\n')
    code, _, err = run_cli(capsys, "install", "router", "--config", str(bad), "--dry-run")
    assert code == 1 and "without CURVE" in err
    bad.write_text("[router]\nport = 0\n")
    code, _, err = run_cli(capsys, "install", "router", "--config", str(bad), "--dry-run")
    assert code == 1 and "router.port: expected an integer 1-65535, got 0" in err


def test_the_shell_wrapper_exists_and_is_executable():
    script = ROOT / "scripts" / "install-service"
    assert os.access(script, os.X_OK)


# ------------------------------------------------------------ LaunchDaemons (headless Macs)
# No macOS here: these check the plists and the launchctl command lines, not launchd itself.


def test_daemon_plist_runs_as_its_user_with_a_home():
    install = dataclasses.replace(make_install(), user="fleet", log_dir=services.DAEMON_LOG_DIR)
    files = services.render_launchd("worker", install, workers=2)
    plists = [plistlib.loads(f.text.encode()) for f in files]
    assert [p["UserName"] for p in plists] == ["fleet", "fleet"]
    assert plists[0]["EnvironmentVariables"]["HOME"] == services.user_home("fleet")
    assert plists[1]["StandardOutPath"] == "/Library/Logs/mlx-fleet/worker-2.log"
    assert plists[0]["KeepAlive"] is True and plists[0]["RunAtLoad"] is True
    agent = plistlib.loads(services.render_launchd("router", make_install())[0].text.encode())
    assert "UserName" not in agent and "HOME" not in agent["EnvironmentVariables"]


def test_daemon_dry_run_prints_system_domain_commands_and_changes_nothing(
    capsys, config_file, no_subprocess, monkeypatch
):
    monkeypatch.setenv("SUDO_USER", "ann")
    monkeypatch.setattr(services, "LAUNCH_DAEMONS_DIR", Path("/nonexistent/LaunchDaemons"))
    code, out, _ = run_cli(
        capsys,
        "install",
        "worker",
        "--daemon",
        "--workers",
        "2",
        "--config",
        str(config_file),
        "--dry-run",
    )
    assert code == 0 and not Path("/nonexistent").exists()
    folder = "/nonexistent/LaunchDaemons"
    assert f"# ---- {folder}/com.mlx-fleet.worker.2.plist" in out
    assert "<key>UserName</key>\n\t<string>ann</string>" in out
    assert "$ install -d -o ann -m 755 /Library/Logs/mlx-fleet" in out
    assert f"$ launchctl bootstrap system {folder}/com.mlx-fleet.worker.1.plist" in out
    assert "gui/" not in out


def test_daemon_status_and_uninstall_act_on_the_system_domain(
    tmp_path, capsys, config_file, no_subprocess, monkeypatch
):
    monkeypatch.setenv("SUDO_USER", "ann")
    folder = tmp_path / "daemons"
    run_cli(
        capsys,
        "install",
        "router",
        "--daemon",
        "--config",
        str(config_file),
        "--dry-run",
        "--out",
        str(folder),
    )
    assert oct((folder / "com.mlx-fleet.router.plist").stat().st_mode & 0o777) == "0o644"
    _, out, _ = run_cli(capsys, "status", "router", "--daemon", "--out", str(folder), "--dry-run")
    assert "$ launchctl print system/com.mlx-fleet.router" in out
    _, out, _ = run_cli(
        capsys, "uninstall", "router", "--daemon", "--out", str(folder), "--dry-run"
    )
    assert "$ launchctl bootout system/com.mlx-fleet.router" in out


def test_daemon_refusals(capsys, config_file, no_subprocess, monkeypatch):
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 501)
    with pytest.raises(SystemExit):  # not root, not a dry run
        install_cli.main(["install", "router", "--daemon", "--config", str(config_file)])
    assert "sudo" in capsys.readouterr().err
    code, _, err = run_cli(
        capsys,
        "install",
        "router",
        "--daemon",
        "--user",
        "root",
        "--config",
        str(config_file),
        "--dry-run",
    )
    assert code == 1 and "--user" in err
    with pytest.raises(SystemExit):
        install_cli.main(["status", "router", "--daemon", "--systemd", "--dry-run"])


def test_host_agent_service_one_per_machine(tmp_path):
    [file] = services.render_launchd("host", make_install())
    plist = plistlib.loads(file.text.encode())
    assert file.name == "com.mlx-fleet.host.plist" and plist["Label"] == "com.mlx-fleet.host"
    assert plist["ProgramArguments"] == [
        "/opt/fleet/.venv/bin/python",
        "-m",
        "fleet.host",
        "--config",
        "/opt/fleet/fleet.toml",
    ]
    assert plist["StandardOutPath"] == "/opt/fleet/logs/host.log" and plist["KeepAlive"]
    _lint(tmp_path, file)
    unit = services.render_systemd("host", make_install(ODD))
    assert unit.name == "mlx-fleet-host.service" == services.systemd_units("host")[0]
    assert "-m fleet.host --config" in unit.text and "KillMode=mixed" in unit.text
    (tmp_path / "com.mlx-fleet.host.plist").write_text(file.text)
    [found] = services.installed_launchd("host", tmp_path)
    assert found.label == "com.mlx-fleet.host"


def test_install_host_dry_run(tmp_path, capsys):
    config = tmp_path / "fleet.toml"
    config.write_text('[[models]]\nid = "smol"\n[host]\nmemory_budget = "8GiB"\n')
    out = tmp_path / "out"
    argv = ["install", "host", "--config", str(config), "--systemd", "--dry-run", "--out", str(out)]
    assert install_cli.main(argv) == 0
    assert (out / "mlx-fleet-host.service").exists()
    assert "enable --now mlx-fleet-host.service" in capsys.readouterr().out
