"""scripts/mac-check end to end, as a user runs it (here without Metal)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.paths import ROOT


def test_quick_report_has_every_section_and_says_metal_is_missing():
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(
        ["scripts/mac-check", "--quick", "--skip-engine", "--skip-cluster", "--repeats", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = result.stdout
    headings = re.findall(r"^## (.+)$", report, flags=re.MULTILINE)
    assert headings == ["Machine", "Kernel self-test", "Kernel vs MLX ops", "Engine benchmark",
                        "Cluster"]  # fmt: skip
    assert report.startswith("# mlx-fleet mac-check (decode, 32 heads / 8 KV heads")
    for field in ("- machine:", "- OS:", "- Python:", "- MLX:", "- Metal available:"):
        assert field in report
    if "- Metal available: no" in report:
        assert report.count("| no | - | - | - | Metal is not available") == 3
        assert 'backend "auto" picks: mlx' in report
        rows = re.findall(r"^\| (\d+) \| (\d+) \| 16 \| unavailable \| ([\d.]+) \| - \|$",
                          report, flags=re.MULTILINE)  # fmt: skip
        assert [(b, c) for b, c, _ in rows] == [("1", "512"), ("8", "512")]
        assert all(float(ms) > 0 for _, _, ms in rows)
    assert "skipped (--skip-engine)" in report and "skipped (--skip-cluster)" in report
