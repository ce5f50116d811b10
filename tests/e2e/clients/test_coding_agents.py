"""The real coding agents, a few non-interactive turns each, against a launched cluster:
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
def test_turns_without_a_protocol_error_read_the_cache(agent, model_cache):
    """The agent's turns (Claude Code: three and a new session; Codex: three) end without a
    protocol error, and every request after its first reads >= 90% of its prompt from cache
    (the script's own rule; docs/api.md "Coding agents")."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "scripts/check_coding_agents.py", "--agent", agent, "--no-cch-replay"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    start = out.stdout.index("{")
    report, _ = json.JSONDecoder().raw_decode(out.stdout[start:])
    (result,) = report["agents"]
    print(json.dumps(result, indent=1))
    assert report["requests"], out.stderr
    assert all(r["status"] < 400 for r in report["requests"]), report["requests"]
    assert report["passed"], report["why"]
    assert out.returncode == 0
