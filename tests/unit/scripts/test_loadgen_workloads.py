"""Load generator workloads: seeded, and shaped as they claim (who shares which prefix)."""

from __future__ import annotations

import itertools
import os

import pytest

from scripts.loadgen.workloads import WORKLOADS, Shape, build

SMALL = Shape(tenants=3, prefix_words=60, question_words=5, turns=4, answer_words=10, shots=3)


def common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def flat(messages) -> str:
    """The conversation as one string, as a chat template would lay it out (roles + texts)."""
    return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_same_seed_same_prompts_other_seed_other_prompts(name):
    assert build(name, 20, seed=7, shape=SMALL) == build(name, 20, seed=7, shape=SMALL)
    assert build(name, 20, seed=7, shape=SMALL) != build(name, 20, seed=8, shape=SMALL)
    assert len(build(name, 20, seed=7, shape=SMALL)) == 20


def test_aliases_and_unknown_names():
    assert build("chat", 5, 0, SMALL) == build("multi_tenant", 5, 0, SMALL)
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        build("nope", 5, 0, SMALL)


def test_multi_tenant_requests_of_a_tenant_share_the_long_system_prompt():
    prompts = build("multi_tenant", 40, 0, SMALL)
    assert {p.group for p in prompts} == {f"tenant-{t}" for t in range(SMALL.tenants)}
    for a, b in itertools.combinations(prompts, 2):
        shared = common_prefix(flat(a.messages), flat(b.messages))
        if a.group == b.group:
            assert a.messages[0] == b.messages[0]
            assert len(a.messages[0]["content"].split()) >= SMALL.prefix_words
        else:  # only "You are the assistant of tenant " in common
            assert shared < 50
    questions = [p.messages[-1]["content"] for p in prompts]
    assert len(set(questions)) == len(questions)


def test_multi_turn_each_turn_extends_the_previous_turn_of_its_conversation():
    prompts = build("multi_turn", 20, 0, SMALL)
    by_conversation: dict[str, list] = {}
    for p in prompts:
        by_conversation.setdefault(p.group, []).append(p.messages)
    assert len(by_conversation) == 5  # 20 requests / 4 turns
    for turns in by_conversation.values():
        assert len(turns) == SMALL.turns
        for earlier, later in itertools.pairwise(turns):
            assert later[: len(earlier)] == earlier
            assert [m["role"] for m in later[len(earlier) :]] == ["assistant", "user"]
    # the assistant turns are fixed text: the same at the same turn of every conversation
    last_turns = [turns[-1] for turns in by_conversation.values()]
    assistant_texts = {
        tuple(m["content"] for m in t if m["role"] == "assistant") for t in last_turns
    }
    assert len(assistant_texts) == 1


def test_multi_turn_sends_turn_t_of_every_conversation_before_turn_t_plus_1():
    prompts = build("multi_turn", 12, 0, SMALL)
    lengths = [len(p.messages) for p in prompts]
    assert lengths == sorted(lengths)


def test_few_shot_prompts_share_the_example_block_and_differ_in_the_question():
    prompts = build("few_shot", 10, 0, SMALL)
    block = prompts[0].messages[:-1]
    assert len(block) == 1 + 2 * SMALL.shots
    assert all(p.messages[:-1] == block for p in prompts)
    assert len({p.messages[-1]["content"] for p in prompts}) == 10


def test_control_prompts_share_no_prefix_but_have_the_multi_tenant_length():
    prompts = build("control", 40, 0, SMALL)
    for a, b in itertools.combinations(prompts, 2):
        assert common_prefix(a.messages[0]["content"], b.messages[0]["content"]) < 20
    tenant = build("multi_tenant", 1, 0, SMALL)[0]
    size = len(tenant.messages[0]["content"].split())
    assert all(abs(len(p.messages[0]["content"].split()) - size) <= 5 for p in prompts)


def test_code_edit_tasks_share_a_tool_preamble_and_give_a_whole_file_to_repeat():
    prompts = build("code", 12, 0, SMALL)
    assert prompts == build("code_edit", 12, 0, SMALL)
    assert {p.group for p in prompts} <= {f"agent-{t}" for t in range(SMALL.tenants)}
    for a, b in itertools.combinations(prompts, 2):
        assert (a.messages[0] == b.messages[0]) == (a.group == b.group)
    for p in prompts:
        task = p.messages[1]["content"]
        code = task.split("```python\n")[1].split("\n```")[0]
        old = task.split("`")[1]
        assert code.startswith("def ") and old in code  # a file, and the name to rename in it
    assert len({p.messages[1]["content"] for p in prompts}) == len(prompts)


def test_cold_mix_interleaves_unique_long_prompts_with_short_decodes():
    from scripts.loadgen.workloads import COLD_MIX_LONG_OUTPUT, Shape, build

    prompts = build("cold_mix", 12, 0, Shape(prefix_words=1600, long_every=4))
    long = [p for p in prompts if p.group.startswith("cold-")]
    assert [prompts.index(p) for p in long] == [3, 7, 11]
    assert {p.max_tokens for p in long} == {COLD_MIX_LONG_OUTPUT}
    assert len({p.messages[0]["content"][:40] for p in long}) == 3  # unique from the start
    assert all(len(p.messages[0]["content"].split()) > 1600 for p in long)
    short = [p for p in prompts if p not in long]
    assert all(p.max_tokens is None and len(p.messages[0]["content"].split()) < 30 for p in short)
    assert build("cold_mix", 12, 0, Shape(prefix_words=1600)) == prompts  # seeded
