"""scripts/kv_quality.py on its tiny second architecture (no download, a few seconds)."""

from __future__ import annotations

import re

import pytest

from scripts.kv_quality import main


def test_tiny_qwen3_reports_each_layout(capsys):
    main(["--models", "tiny-qwen3", "--layouts", "8:64,4:32", "--tiny-tokens", "600"])
    out = capsys.readouterr().out
    assert out.startswith("## tiny-qwen3\n600 tokens; unquantized: mean logprob")
    rows = dict(re.findall(r"^(q\dg\d+)\s+([\d.]+)%", out, flags=re.MULTILINE))
    assert set(rows) == {"q8g64", "q4g32"}
    assert float(rows["q8g64"]) >= 99.0  # the bar at 8 bits
    assert float(rows["q4g32"]) <= float(rows["q8g64"])


@pytest.mark.slow
def test_the_default_model_keeps_99_percent_top1_at_8_bits(capsys):
    """The issue's bar on the real model and the shipped text's first 2,048 tokens (eight
    chunks, each after the first reading K/V back from the pool): 8-bit K/V, groups of 64,
    agrees with unquantized K/V on the next token at >= 99% of positions (99.56% when
    measured, 52 s; the whole text, ~4.4k tokens, 99.16% in 169 s, is the script's default;
    98.38% before keys were stored rotated, worker.kv.quant.rotate)."""
    main(["--models", "default", "--layouts", "8:64", "--text-tokens", "2048"])
    rows = dict(re.findall(r"^(q\dg\d+)\s+([\d.]+)%", capsys.readouterr().out, flags=re.M))
    assert float(rows["q8g64"]) >= 99.0
