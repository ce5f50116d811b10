"""The machine's memory and a process's resident memory, without psutil: /proc on Linux,
`ps` on macOS (unified memory: the GPU's share is in the same total)."""

from __future__ import annotations

import os
import subprocess
import sys

DEFAULT_BUDGET_SHARE = 0.75  # of physical memory; the rest is the OS's and the router's


def physical_bytes() -> int:
    """The machine's memory (0: unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def default_budget() -> int:
    """What a host's workers may take when nothing sets it: 3/4 of the machine's memory."""
    return int(physical_bytes() * DEFAULT_BUDGET_SHARE)


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (0: gone, or not measurable here)."""
    if sys.platform.startswith("linux"):
        return _proc_status_rss(pid)
    try:
        out = subprocess.run(
            ["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, timeout=5
        ).stdout
        return int(out.strip()) * 1024 if out.strip().isdigit() else 0
    except (OSError, subprocess.SubprocessError):
        return 0


def _proc_status_rss(pid: int) -> int:
    """VmRSS of /proc/PID/status, in kB there."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return 0
