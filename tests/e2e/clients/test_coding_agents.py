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


@pytest.fixture(scope="module")
def cluster_url(model_cache, tmp_path_factory):
    """One cluster for both agents, started as the script starts its own. The agents' prompts
    share only the chat template's first 3 tokens (Claude Code's first request reads those
    after Codex's turns), so every judged cache read is of the agent's own earlier turns."""
    from scripts import check_coding_agents as check

    proc, url = check.start_cluster(check.long_context_model(), tmp_path_factory.mktemp("agents"))
    try:
        check.wait_healthy(url)
        yield url
    finally:
        check.stop_cluster(proc)


@pytest.mark.parametrize("agent", ["codex-cli", "claude-code"])
def test_turns_without_a_protocol_error_read_the_cache(agent, cluster_url):
    """The agent's turns (Claude Code: three and a new session; Codex: three) end without a
    protocol error, and every request after its first reads >= 90% of its prompt from cache
    (the script's own rule; docs/api.md "Coding agents")."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["scripts/check_coding_agents.py", "--agent", agent, "--no-cch-replay"]
    out = subprocess.run(
        [sys.executable, *argv, "--url", cluster_url],
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
