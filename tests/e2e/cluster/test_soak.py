"""The short soak (scripts/soak.py): launch-cluster --workers 2 with the real default model
under a light mixed load for 40 s, one worker SIGKILLed at 15 s and one SIGSTOPped for 5 s at
30 s (or once the kill is recovered from, while the load still runs): no request lost or hung,
each fault recovered from within 30 s, the report complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

SHORT = [
    "--duration",
    "40",
    "--rate",
    "0.3",
    "--max-tokens",
    "8",
    "--faults",
    "worker-kill,worker-stop",
    "--fault-every",
    "15",
    "--stop-seconds",
    "5",
    "--sample-every",
    "2",
    "--deadline",
    "40",
]


def test_short_soak_loses_nothing_and_recovers(default_model_dir, tmp_path):
    out = tmp_path / "report.json"
    cmd = [sys.executable, "scripts/soak.py", *SHORT, "--out", str(out)]
    cmd += ["--log-dir", str(tmp_path / "logs")]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    print(done.stderr[-3000:])
    report = json.loads(out.read_text())
    outcomes = report["requests"]["by_outcome"]
    assert outcomes.get("lost", 0) == 0, report["requests"]
    assert outcomes.get("hung", 0) == 0, report["requests"]
    assert outcomes.get("completed", 0) > 0
    assert report["requests"]["hostile_not_4xx"] == 0
    assert done.returncode == 0, done.stderr[-2000:]
    assert [f["fault"] for f in report["faults"]] == ["worker-kill", "worker-stop"]
    for fault in report["faults"]:
        assert fault["recovered"] and fault["recovery_s"] < 30, fault
    roles = {p["role"] for p in report["processes"]}
    assert roles == {"launcher", "router", "worker"}
    for p in report["processes"]:
        assert {"rss_mb_last", "rss_slope_mb_per_hour", "open_files_max", "threads_max"} <= set(p)
        assert p["rss_mb_each_minute"][0] > 0
    # the workers' heartbeats say what MLX holds (weights and pool: most of the RSS)
    measured = [p for p in report["processes"] if "host_mb_last" in p]
    assert measured and all(p["role"] == "worker" for p in measured)
    for p in measured:
        assert 0 < p["mlx_active_mb_last"] < p["rss_mb_max"], p
    assert report["cluster"]["samples"] > 0
    assert {"pending_max", "inflight_max", "kv_used_fraction_max"} <= set(report["cluster"])
    # the workers checked their pools' integrity while idle, and every check held
    assert sum(report["cluster"]["kv_checks"].values()) > 0
    assert report["cluster"]["kv_check_failures_max"] == 0
