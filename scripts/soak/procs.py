"""The cluster's processes and their resources: RSS, open files and threads, from /proc on
Linux and `ps` elsewhere (where open files and threads are not read: None)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict

LINUX = sys.platform.startswith("linux")


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def process_table() -> list[tuple[int, int, str]]:
    """(pid, ppid, command line) of every process we can see."""
    if not LINUX:
        out = subprocess.run(
            ["ps", "-axo", "pid=,ppid=,command="], capture_output=True, text=True, check=False
        ).stdout
        rows = []
        for line in out.splitlines():
            pid, ppid, cmd = line.split(None, 2)
            rows.append((int(pid), int(ppid), cmd))
        return rows
    rows = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                rows.append((int(name), _ppid(int(name)), _cmdline(int(name))))
            except (OSError, ValueError, IndexError):
                continue
    return rows


def role(cmd: str) -> str | None:
    """launch-cluster's children run `python -m <entry> router ...` / `... worker ...`."""
    words = cmd.split()
    for w in ("router", "worker"):
        if w in words:
            return w
    return None


def cluster_processes(launcher_pid: int) -> dict[int, str]:
    """pid -> role ("launcher", "router", "worker") of the launcher and its children."""
    found = {launcher_pid: "launcher"}
    for pid, ppid, cmd in process_table():
        if ppid == launcher_pid and (r := role(cmd)):
            found[pid] = r
    return found


def resources(pid: int) -> dict | None:
    """rss_mb, open_files, threads of one process; None when it is gone."""
    if not LINUX:
        out = subprocess.run(
            ["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, check=False
        ).stdout.strip()
        return {"rss_mb": int(out) / 1024, "open_files": None, "threads": None} if out else None
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        if status.get("State", "").strip().startswith("Z"):
            return None
        rss_kb = int(status["VmRSS"].split()[0])
        return {
            "rss_mb": rss_kb / 1024,
            "open_files": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(status["Threads"]),
        }
    except (OSError, KeyError, ValueError):
        return None


class Sampler:
    """Samples of every cluster process over time, keyed by (role, pid): a restarted process
    is a new series."""

    def __init__(self, launcher_pid: int):
        self.launcher_pid = launcher_pid
        self.series: dict[tuple[str, int], list[tuple[float, dict]]] = defaultdict(list)
        self.start = time.monotonic()

    def sample(self, memory: dict[int, dict] | None = None) -> None:
        """`memory`: per worker pid, what its MLX holds (ClusterWatch.memory), kept with its
        RSS so that the report can tell the host's share of the RSS from MLX's."""
        now = time.monotonic() - self.start
        for pid, r in cluster_processes(self.launcher_pid).items():
            if (res := resources(pid)) is not None:
                self.series[(r, pid)].append((now, res | (memory or {}).get(pid, {})))

    def report(self, warmup_fraction: float = 0.2) -> list[dict]:
        """Per process; the RSS slope over its samples after the first 20% of its own life
        (a restarted worker's warm-up is its model loading)."""
        out = []
        for (r, pid), samples in sorted(self.series.items()):
            warm = samples[0][0] + (samples[-1][0] - samples[0][0]) * warmup_fraction
            after = [(t, s["rss_mb"]) for t, s in samples if t >= warm]
            out.append(
                {
                    "role": r,
                    "pid": pid,
                    "samples": len(samples),
                    "seconds": round(samples[-1][0] - samples[0][0], 1),
                    "rss_mb_first": round(samples[0][1]["rss_mb"], 1),
                    "rss_mb_last": round(samples[-1][1]["rss_mb"], 1),
                    "rss_mb_max": round(max(s["rss_mb"] for _, s in samples), 1),
                    "rss_slope_mb_per_hour": slope_per_hour(after),
                    "open_files_max": _max(samples, "open_files"),
                    "threads_max": _max(samples, "threads"),
                    "rss_mb_each_minute": _each_minute(samples),
                }
                | _mlx_share(samples, warm)
            )
        return out


def _each_minute(samples) -> list[float]:
    """The RSS at the first sample of each minute of the process's life (a plateau or a
    climb reads off it at a glance)."""
    out, minute = [], None
    for t, s in samples:
        if minute is None or t >= minute + 60:
            out.append(round(s["rss_mb"]))
            minute = t
    return out


def _mlx_share(samples, warm: float) -> dict:
    """For a worker: the last of what its MLX held, and the slope of the rest of its RSS (the
    host's: Python, libraries) after warm-up; {} when the router never reported it."""
    known = [(t, s) for t, s in samples if "mlx_active_mb" in s]
    if not known:
        return {}
    last = known[-1][1]
    host = [(t, s["rss_mb"] - s["mlx_active_mb"] - s["mlx_cache_mb"]) for t, s in known]
    return {
        "mlx_active_mb_last": last["mlx_active_mb"],
        "mlx_cache_mb_last": last["mlx_cache_mb"],
        "prefix_kv_mb_max": max(s["prefix_kv_mb"] for _, s in known),
        "host_mb_first": round(host[0][1], 1),
        "host_mb_last": round(host[-1][1], 1),
        "host_slope_mb_per_hour": slope_per_hour([(t, v) for t, v in host if t >= warm]),
    }


def _max(samples, key):
    values = [s[key] for _, s in samples if s[key] is not None]
    return max(values) if values else None


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) points, in MB per hour; None under 3 points."""
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mt) * (v - mv) for t, v in points)
    return round(cov / var * 3600, 2)
