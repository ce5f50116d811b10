"""scripts/mac-check end to end, as a user runs it (here without Metal)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from tests.support.paths import ROOT


def test_quick_report_has_every_section_and_says_metal_is_missing():
    env = {**os.environ, "PYTHON": sys.executable}
    args = ["--quick", "--skip-engine", "--skip-cluster", "--repeats", "1"]
    # a quarter of the default heads: the MLX-ops timings, most of the run, take a quarter as
    # long; the report has the same sections and rows
    args += ["--heads", "8", "--kv-heads", "2"]
    result = subprocess.run(
        ["scripts/mac-check", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = result.stdout
    headings = re.findall(r"^## (.+)$", report, flags=re.MULTILINE)
    assert headings == [
        "Machine",
        "Kernel self-test",
        "Kernel vs MLX ops",
        "Engine benchmark",
        "Cluster",
    ]
    assert report.startswith("# mlx-fleet mac-check (decode, 8 heads / 2 KV heads")
    for field in ("- machine:", "- OS:", "- Python:", "- MLX:", "- Metal available:"):
        assert field in report
    if "- Metal available: no" in report:
        # every block size for the dtype and the 8- and 4-bit layouts (the quantized kernel)
        # (the variants: split-K, prefix-grouped, and the window and sink features)
        assert report.count("| no | - | - | - | Metal is not available") == 9 + 36
        for kv in ("float16", "q8g64", "q4g64"):  # each variant's self-test row per layout
            for variant in ("split", "grouped", "window", "sinks"):
                assert report.count(f"| {kv} | 16 | {variant} | no | - | - | - | Metal is not") == 1
        for kv in ("float16", "q8g64", "q4g64"):
            assert f'backend "auto" picks ({kv}): mlx' in report
            assert report.count(f"| {kv} | 16 | float16 | no |") == 1
        rows = re.findall(
            r"^\| (\w+) \| (\d+) \| (\d+) \| 16 \| unavailable \| ([\d.]+) \| - \|$",
            report,
            flags=re.MULTILINE,
        )
        assert [(kv, b, c) for kv, b, c, _ in rows] == [
            (kv, b, "512") for kv in ("float16", "q8g64", "q4g64") for b in ("1", "8")
        ]
        assert all(float(ms) > 0 for *_, ms in rows)
    assert "skipped (--skip-engine)" in report and "skipped (--skip-cluster)" in report


def run_wrapper(root, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["scripts/mac-check", "--quick"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_fresh_checkout_without_venv_is_told_what_to_run(tmp_path):
    """No .venv (and no PYTHON): exit 2 and the exact commands, never a traceback."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "mac-check", tmp_path / "scripts" / "mac-check")
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    result = run_wrapper(tmp_path, env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert "this checkout is not set up (.venv/bin/python not found)" in result.stderr
    assert "    scripts/setup " in result.stderr
    assert "    scripts/mac-check --quick\n" in result.stderr
    assert "    scripts/mac-check --setup --quick\n" in result.stderr


def test_a_python_without_mlx_is_told_what_to_run(tmp_path):
    """PYTHON that can't import MLX (as the old python3 fallback): exit 2, no traceback."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'Traceback: ModuleNotFoundError: mlx' >&2\nexit 1\n")
    python.chmod(0o755)
    result = run_wrapper(ROOT, {**os.environ, "PYTHON": str(python)})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert f"mac-check: {python} cannot import MLX (mlx.core)." in result.stderr
    assert "    scripts/setup " in result.stderr
