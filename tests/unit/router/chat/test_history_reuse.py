"""Reasoning in history: a three-turn tool loop (tests/support/dialects/tool_loop.py) through
the router's prompt building, per family's real template; where each turn's prompt leaves what
the previous turn generated, and how much of it the prefix cache serves. The numbers are
scripts/history_reuse.py's (docs/api.md, "Reasoning in history")."""

from __future__ import annotations

import pytest

from tests.support.dialects.tool_loop import LOOP_FAMILIES, family_tokenizer, run_loop

BS = 32  # shared.config.choices.DEFAULT_BLOCK_SIZE, pinned: the shares below were measured at it


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("history")
    specs = {f.spec for f in LOOP_FAMILIES.values()}
    return {spec: family_tokenizer(spec, root) for spec in specs}


@pytest.fixture(scope="module")
def loops(tokenizers):
    """(family, reasoning sent back) -> its three turns."""
    return {
        (name, sent): run_loop(f, tokenizers[f.spec], BS, drop_reasoning=not sent)
        for name, f in LOOP_FAMILIES.items()
        for sent in (True, False)
    }


def test_qwen3_keeps_the_loops_reasoning_and_reuses_every_earlier_token(loops):
    # its template keeps reasoning after the last user message: the whole loop
    for turn in loops["qwen3", True][1:]:
        assert turn.divergence is None and turn.common == len(turn.previous)
    assert loops["qwen3", True][2].cached / len(loops["qwen3", True][2].prompt) >= 0.9


def test_qwen3_without_reasoning_diverges_where_the_reply_began(loops):
    for turn in loops["qwen3", False][1:]:
        assert turn.divergence["at"] == turn.previous_prompt
        assert turn.divergence["generated"].startswith("<think>")
        assert turn.divergence["rendered"].startswith("<tool_call>")


def test_gpt_oss_keeps_the_analysis_but_writes_the_call_header_its_own_way(loops):
    for turn in loops["gpt_oss", True][1:]:
        d = turn.divergence
        assert d["at"] > turn.previous_prompt  # the analysis message was reused
        assert d["before"].endswith("<|end|><|start|>assistant")
        assert d["generated"].startswith("<|channel|>commentary to=functions.get_weather")
        assert d["rendered"].startswith(" to=functions.get_weather")
    assert loops["gpt_oss", True][2].cached / len(loops["gpt_oss", True][2].prompt) >= 0.8
    # a hybrid's snapshots sit at block ends around the prompt's end, not at the call header
    assert all(t.hybrid_cached < t.cached for t in loops["gpt_oss", True][1:])


def test_gpt_oss_without_reasoning_diverges_where_the_reply_began(loops):
    for turn in loops["gpt_oss", False][1:]:
        assert turn.divergence["at"] == turn.previous_prompt
        assert turn.divergence["generated"].startswith("<|channel|>analysis")


@pytest.mark.parametrize("sent", [True, False])
def test_deepseek_r1_diverges_one_token_before_the_prompt_end(loops, sent):
    # the generation prompt's trailing newline is not in the history (nor the reasoning)
    for turn in loops["deepseek_r1", sent][1:]:
        assert turn.divergence["at"] == turn.previous_prompt - 1
        assert turn.divergence["generated"].startswith("\n<think>")
    assert loops["deepseek_r1", sent][2].cached / len(loops["deepseek_r1", sent][2].prompt) >= 0.9


def test_deepseek_v31_reuses_every_earlier_token_without_thinking(loops):
    for turn in loops["deepseek_v31", True][1:]:
        assert turn.divergence is None and turn.common == len(turn.previous)
        assert turn.cached / len(turn.prompt) >= 0.88


def test_deepseek_v31_thinking_replaces_the_opened_think_in_history(loops):
    second = loops["deepseek_v31_thinking", True][1]
    assert second.divergence["at"] == second.previous_prompt - 1
    assert second.divergence["generated"].startswith("<think>")
    assert second.divergence["rendered"].startswith("</think>")


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1", "deepseek_v31", "deepseek_v31_thinking"])
def test_a_hybrid_hits_as_deep_as_full_attention_where_history_diverges_near_the_prompt_end(
    loops, name
):
    for sent in (True, False):
        for turn in loops[name, sent][1:]:
            assert turn.hybrid_cached == turn.cached > 0
