"""The real coding agents, one non-interactive turn each, against a launched cluster:
scripts/check-coding-agents (Codex CLI over /v1/responses, Claude Code over /v1/messages).

Opt-in and slow: the agents are npm packages (`npm install --prefix .agents @openai/codex
@anthropic-ai/claude-code`, or let the script install them) and Codex CLI's first turn is a
5,800-token prefill. Skipped when they are not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = ROOT / ".agents" / "node_modules" / ".bin"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not ((BIN / "codex").exists() and (BIN / "claude").exists()),
        reason="the coding agents are not installed: npm install --prefix .agents "
        "@openai/codex @anthropic-ai/claude-code",
    ),
]


@pytest.mark.parametrize("agent", ["codex-cli", "claude-code"])
def test_one_turn_without_a_protocol_error(agent, model_cache):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "scripts/check_coding_agents.py", "--agent", agent, "--timeout", "900"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    report = json.loads(out.stdout)
    (result,) = report["agents"]
    print(json.dumps(result, indent=1))
    assert result["requests"], out.stderr
    assert all(r["status"] < 400 for r in result["requests"]), result["requests"]
    assert not result["protocol_error"]
    assert out.returncode == 0
