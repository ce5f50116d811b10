"""Render and manage the fleet's services: launchd user agents or system daemons on macOS,
systemd user units on Linux. Pure functions build the files and the launchctl / systemctl command lines; only
`main` writes files and runs commands (`scripts/install-service --help`)."""

from __future__ import annotations

import os
import plistlib
import pwd
import re
import socket
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent
ROUTER_LABEL = "com.mlx-fleet.router"
WORKER_LABEL = "com.mlx-fleet.worker"  # + ".N" per worker process
ROUTER_UNIT = "mlx-fleet-router.service"
WORKER_UNIT = "mlx-fleet-worker@.service"  # instances mlx-fleet-worker@N.service
HOST_LABEL = "com.mlx-fleet.host"  # the host agent: one per machine, it starts the workers
HOST_UNIT = "mlx-fleet-host.service"
ROLES = ("router", "worker", "host")
SINGLE = {"router": (ROUTER_LABEL, ROUTER_UNIT), "host": (HOST_LABEL, HOST_UNIT)}  # one each


@dataclass(frozen=True)
class Install:
    """Where things are on this host: the checkout, its venv, the config, the logs."""

    root: Path
    venv: Path
    config: Path
    log_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    hostname: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    user: str | None = None  # launchd daemons: the account they run as (UserName)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def cluster_worker(self) -> Path:
        return self.venv / "bin" / "cluster-worker"


@dataclass(frozen=True)
class ServiceFile:
    name: str  # file name in the service folder
    text: str
    label: str  # launchd label or systemd unit to act on


# ------------------------------------------------------------ launchd


def launch_agents_dir() -> Path:
    return Path.home() / "Library" / "LaunchAgents"


# Daemons run at boot with nobody logged in (fleet Macs), as `UserName`, in launchd's system
# domain; installing them needs root.
LAUNCH_DAEMONS_DIR = Path("/Library/LaunchDaemons")
DAEMON_LOG_DIR = Path("/Library/Logs/mlx-fleet")


def launchd_domain(daemon: bool) -> str:
    return "system" if daemon else f"gui/{os.getuid()}"


def user_home(user: str) -> str:
    """The account's home folder (the model cache lives under it); /Users/NAME if unknown here."""
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        return f"/Users/{user}"


def render_launchd(role: str, install: Install, workers: int = 1) -> list[ServiceFile]:
    """One plist for the router or the host agent; one per worker process (labels
    com.mlx-fleet.worker.1..N)."""
    if role in SINGLE:
        label = SINGLE[role][0]
        return [_plist(f"{label}.plist", label, install, {})]
    return [
        _plist(
            f"{WORKER_LABEL}.plist",
            f"{WORKER_LABEL}.{n}",
            install,
            {"INSTANCE": str(n), "WORKER_ID": f"{install.hostname}-{n}"},
        )
        for n in range(1, workers + 1)
    ]


def _plist(template: str, label: str, install: Install, extra: dict[str, str]) -> ServiceFile:
    values = {
        "LABEL": label,
        "ROOT": str(install.root),
        "VENV": str(install.venv),
        "PYTHON": str(install.python),
        "CLUSTER_WORKER": str(install.cluster_worker),
        "CONFIG": str(install.config),
        "LOG_DIR": str(install.log_dir),
        **extra,
    }
    # Parse the template, then fill strings: the output is valid XML whatever the paths hold.
    with open(TEMPLATES / "launchd" / template, "rb") as f:
        plist = _fill(plistlib.load(f), values)
    if install.user is not None:
        plist["UserName"] = install.user
        # launchd gives a daemon no HOME of its user: the model cache and ~ paths need it
        plist["EnvironmentVariables"]["HOME"] = user_home(install.user)
    plist["EnvironmentVariables"].update(install.env)
    text = plistlib.dumps(plist, sort_keys=False).decode()
    return ServiceFile(f"{label}.plist", text, label)


def _fill(node, values: Mapping[str, str]):
    if isinstance(node, str):
        return string.Template(node).substitute(values)
    if isinstance(node, list):
        return [_fill(item, values) for item in node]
    if isinstance(node, dict):
        return {key: _fill(value, values) for key, value in node.items()}
    return node


def launchctl_commands(
    action: str, files: list[ServiceFile], folder: Path, domain: str | None = None
) -> list[list[str]]:
    """launchctl command lines in `domain` (default: this user's GUI session, for agents)."""
    domain = domain or launchd_domain(daemon=False)
    commands = []
    for file in files:
        target = f"{domain}/{file.label}"
        if action == "load":
            commands.append(["launchctl", "bootstrap", domain, str(folder / file.name)])
        elif action == "unload":
            commands.append(["launchctl", "bootout", target])
        elif action == "restart":
            commands.append(["launchctl", "kickstart", "-k", target])
        elif action == "status":
            commands.append(["launchctl", "print", target])
    return commands


def installed_launchd(role: str, folder: Path) -> list[ServiceFile]:
    """The agents of `role` already in `folder` (text not needed to act on them)."""
    if role in SINGLE:
        plist = f"{SINGLE[role][0]}.plist"
        names = [plist] if (folder / plist).exists() else []
    else:
        pattern = re.compile(rf"^{re.escape(WORKER_LABEL)}\.\d+\.plist$")
        names = sorted(
            p.name for p in folder.glob(f"{WORKER_LABEL}.*.plist") if pattern.match(p.name)
        )
    return [ServiceFile(name, "", name.removesuffix(".plist")) for name in names]


# ------------------------------------------------------------ systemd


def systemd_user_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "systemd" / "user"


def render_systemd(role: str, install: Install) -> ServiceFile:
    """The router or host agent unit, or the worker template unit (instances @1..@N)."""
    name = unit_file(role)
    environment = "".join(
        f"\nEnvironment={_quoted(_specifiers(f'{key}={value}'))}"
        for key, value in install.env.items()
    )
    values = {
        "ROOT": _specifiers(str(install.root)),
        "PYTHON": _exec_arg(str(install.python)),
        "CLUSTER_WORKER": _exec_arg(str(install.cluster_worker)),
        "CONFIG": _exec_arg(str(install.config)),
        "ENVIRONMENT": environment,
    }
    text = string.Template((TEMPLATES / "systemd" / name).read_text()).substitute(values)
    return ServiceFile(name, text, name)


def _specifiers(value: str) -> str:
    """systemd expands %x specifiers in most settings: a literal % is %%."""
    return value.replace("%", "%%")


def _exec_arg(value: str) -> str:
    """One ExecStart= word: % and $ escaped (both are expanded there), quoted if need be."""
    return _quoted(_specifiers(value).replace("$", "$$"))


def _quoted(value: str) -> str:
    if re.search(r"[\s\"'\\]", value):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def unit_file(role: str) -> str:
    """The systemd unit file of `role` (the worker's is a template)."""
    return SINGLE[role][1] if role in SINGLE else WORKER_UNIT


def systemd_units(role: str, workers: int = 1) -> list[str]:
    if role in SINGLE:
        return [SINGLE[role][1]]
    return [f"mlx-fleet-worker@{n}.service" for n in range(1, workers + 1)]


def systemctl_commands(action: str, units: list[str]) -> list[list[str]]:
    user = ["systemctl", "--user"]
    return {
        "load": [[*user, "daemon-reload"], [*user, "enable", "--now", *units]],
        "unload": [[*user, "disable", "--now", *units]],
        "restart": [[*user, "restart", *units]],
        "status": [[*user, "status", "--no-pager", *units]],
    }[action]
