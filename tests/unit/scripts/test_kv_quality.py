"""scripts/kv_quality.py on its tiny second architecture (no download, a few seconds)."""

from __future__ import annotations

import re

from scripts.kv_quality import main


def test_tiny_qwen3_reports_each_layout(capsys):
    main(["--models", "tiny-qwen3", "--layouts", "8:64,4:32", "--tiny-tokens", "600"])
    out = capsys.readouterr().out
    assert out.startswith("## tiny-qwen3\n600 tokens; unquantized: mean logprob")
    rows = dict(re.findall(r"^(q\dg\d+)\s+([\d.]+)%", out, flags=re.MULTILINE))
    assert set(rows) == {"q8g64", "q4g32"}
    assert float(rows["q8g64"]) >= 99.0  # the bar at 8 bits
    assert float(rows["q4g32"]) <= float(rows["q8g64"])
