"""`scripts/install-service ACTION ROLE`: install, start, stop and inspect the fleet's services.

    scripts/install-service install router --config ~/.config/mlx-fleet/fleet.toml
    scripts/install-service install worker --config ~/.config/mlx-fleet/fleet.toml --workers 2
    scripts/install-service status worker
    scripts/install-service install host --config ~/.config/mlx-fleet/fleet.toml  # placement
    scripts/install-service install router --config fleet.toml --dry-run   # print, change nothing
    sudo scripts/install-service install worker --daemon --config /etc/mlx-fleet/fleet.toml

macOS: launchd user agents in ~/Library/LaunchAgents (launchctl bootstrap gui/$UID ...), logs in
~/Library/Logs/mlx-fleet. `--daemon` (macOS, as root): LaunchDaemons in /Library/LaunchDaemons
(launchctl bootstrap system ...) that run at boot with nobody logged in, as `--user` (default:
the user who ran sudo), logs in /Library/Logs/mlx-fleet. Linux (or --systemd): systemd user units in ~/.config/systemd/user
(systemctl --user ...), logs in the journal (journalctl --user -u mlx-fleet-router).
"""

from __future__ import annotations

import argparse
import getpass
import os
import subprocess
import sys
from pathlib import Path

from deploy import services
from shared.config.fields import ConfigError
from shared.config.fleet import MODEL_ID_ENV, FleetConfig, load_config, pick_model, too_open
from shared.curve import CurveError, require_curve

ROOT = Path(__file__).resolve().parent.parent
ACTIONS = ("install", "uninstall", "load", "unload", "restart", "status")
DEFAULT_CONFIG = Path("~/.config/mlx-fleet/fleet.toml")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="install-service",
        description=__doc__.split("\n\n")[0],
        epilog="Actions: install (write the files, then load), uninstall (unload, then remove "
        "the files), load, unload, restart, status.",
    )
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("role", choices=services.ROLES)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the fleet config file")
    p.add_argument("--workers", type=int, default=1, help="worker processes on this host")
    p.add_argument(
        "--model-id",
        help="worker: the [[models]] entry (id or alias) this host's workers serve, when the "
        f"config lists several (sets {MODEL_ID_ENV} in their environment)",
    )
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--launchd", action="store_true", help="launchd agents (macOS default)")
    kind.add_argument("--systemd", action="store_true", help="systemd user units (Linux default)")
    p.add_argument(
        "--daemon",
        action="store_true",
        help="launchd: system LaunchDaemons that run with nobody logged in (needs root)",
    )
    p.add_argument(
        "--user", help="--daemon: the account the services run as (default: the sudo user)"
    )
    p.add_argument("--venv", type=Path, default=ROOT / ".venv", help="the virtual environment")
    p.add_argument(
        "--log-dir",
        type=Path,
        help="launchd logs (default ~/Library/Logs/mlx-fleet; /Library/Logs/mlx-fleet for daemons)",
    )
    p.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment"
    )
    p.add_argument("--out", type=Path, help="write the files here instead of the service folder")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the files and the commands; run nothing, write only into --out if given",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    use_systemd = args.systemd or (
        not args.launchd and not args.daemon and sys.platform != "darwin"
    )
    if args.daemon and use_systemd:
        p.error("--daemon is for launchd (macOS); systemd user units: loginctl enable-linger")
    if args.daemon and not args.dry_run and os.geteuid() != 0:
        p.error("--daemon installs into /Library/LaunchDaemons: run it with sudo")
    folder = args.out or _service_folder(use_systemd, args.daemon)
    try:
        install = _install(args)
        if args.action == "install":
            _check_config(args.role, install.config, args.model_id)
    except (ConfigError, CurveError, ValueError) as e:
        print(f"install-service: {e}", file=sys.stderr)
        return 1
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if use_systemd:
        files, commands = _systemd_plan(args, install, folder)
    else:
        files, commands = _launchd_plan(args, install, folder)
    log_dir = None if use_systemd or args.daemon else install.log_dir  # launchd does not create it
    return _carry_out(args, folder, files, commands, log_dir)


def _service_folder(use_systemd: bool, daemon: bool) -> Path:
    if use_systemd:
        return services.systemd_user_dir()
    return services.LAUNCH_DAEMONS_DIR if daemon else services.launch_agents_dir()


def _daemon_user(args) -> str | None:
    """Whom daemons run as: --user, else whoever ran sudo (never root by accident)."""
    if not args.daemon:
        return None
    user = args.user or os.environ.get("SUDO_USER") or getpass.getuser()
    if user == "root":
        raise ValueError("--daemon: pass --user NAME (the services should not run as root)")
    return user


def _install(args) -> services.Install:
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    if args.model_id is not None:
        env[MODEL_ID_ENV] = args.model_id
    if "MLX_FLEET_CACHE" in os.environ:  # the services should find the same converted models
        env.setdefault("MLX_FLEET_CACHE", os.environ["MLX_FLEET_CACHE"])
    default_logs = services.DAEMON_LOG_DIR if args.daemon else Path("~/Library/Logs/mlx-fleet")
    return services.Install(
        root=ROOT,
        venv=args.venv.expanduser().absolute(),
        config=args.config.expanduser().absolute(),
        log_dir=(args.log_dir or default_logs).expanduser().absolute(),
        env=env,
        user=_daemon_user(args),
    )


def _check_config(role: str, path: Path, model_id: str | None = None) -> FleetConfig:
    """Fail now, not in a restart loop: the file must load and be safe to run on the network."""
    config = load_config(path)
    if role == "worker" and config.models:
        pick_model(config.models, model_id)  # which model the workers serve
    if role == "router":
        require_curve(config.router.zmq_bind, config.router.curve_enabled, "router.zmq_bind")
        if config.router.api_keys and too_open(path):
            _warn(f"{path} holds API keys and others can read it: chmod 600 {path}")
        if any(m.path is None for m in config.served_models):
            _warn(f"{path}: [model] path is not set; the router will not start without it")
    else:
        for router in config.worker.router:
            require_curve(router, config.worker.curve_enabled, "worker.router")
    section = config.router if role == "router" else config.worker
    for key_file in (section.curve_secret_key, getattr(section, "curve_server_key", None)):
        if key_file is not None and not key_file.exists():
            _warn(f"{key_file} does not exist yet (mlx-fleet-keys generate; docs/deploy.md)")
        elif key_file is not None and key_file.suffix == ".key_secret" and too_open(key_file):
            _warn(f"{key_file} can be read by others: chmod 600 {key_file}")
    return config


def _launchd_plan(args, install, folder):
    domain = services.launchd_domain(args.daemon)
    if args.action == "install":
        files = services.render_launchd(args.role, install, args.workers)
        stale = [
            f
            for f in services.installed_launchd(args.role, folder)
            if f.name not in {new.name for new in files}
        ]
        old = services.installed_launchd(args.role, folder)
        commands = _daemon_log_dir(install) if args.daemon else []
        commands += services.launchctl_commands("unload", old, folder, domain)
        commands += services.launchctl_commands("load", files, folder, domain)
        return (files, stale), commands
    files = services.installed_launchd(args.role, folder)
    action = "unload" if args.action == "uninstall" else args.action
    removed = files if args.action == "uninstall" else []
    return ([], removed), services.launchctl_commands(action, files, folder, domain)


def _daemon_log_dir(install) -> list[list[str]]:
    """launchd opens a daemon's log files as root; the folder belongs to its user so the
    service can rotate or reopen them."""
    return [["install", "-d", "-o", install.user, "-m", "755", str(install.log_dir)]]


def _systemd_plan(args, install, folder):
    units = services.systemd_units(args.role, args.workers)
    if args.action == "install":
        files = [services.render_systemd(args.role, install)]
        return (files, []), services.systemctl_commands("load", units)
    action = "unload" if args.action == "uninstall" else args.action
    removed = []
    if args.action == "uninstall":
        name = services.unit_file(args.role)
        removed = [services.ServiceFile(name, "", name)]
    return ([], removed), services.systemctl_commands(action, units)  # reload at the next install


def _carry_out(args, folder: Path, plan, commands, log_dir: Path | None) -> int:
    files, removed = plan
    write = not args.dry_run or args.out is not None
    for file in files:
        if args.dry_run:
            print(f"# ---- {folder / file.name}\n{file.text}")
        if write:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / file.name).write_text(file.text)
            # launchd refuses a daemon plist others can write (and root owns it, via sudo)
            (folder / file.name).chmod(0o644)
    if files and not args.dry_run and log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    status = 0
    for command in commands:
        print("$ " + " ".join(command))
        if not args.dry_run:
            done = subprocess.run(command, check=False)
            # Unloading what is not loaded fails harmlessly; other failures count.
            if done.returncode and command[1:2] != ["bootout"]:
                status = done.returncode
    for file in removed:
        print(f"# remove {folder / file.name}")
        if not args.dry_run:
            (folder / file.name).unlink(missing_ok=True)
    return status


def _warn(message: str) -> None:
    print(f"install-service: warning: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
