"""Agents' prompts as they send them: volatile metadata taken out, cache_control and
prompt_cache_retention as pins on the wire, Anthropic usage as Anthropic counts it (the
official anthropic SDK against the router, with a stand-in worker that caches full blocks)."""

from __future__ import annotations

import anthropic
import pytest

from router.chat.hazards import clock_hazard
from router.text.tokenizer import ModelTokenizer
from tests.support.paths import ROOT

MODEL = "tiny"
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.{}; cc_entrypoint=sdk-cli;"
TOOLS_TEXT = "You are a coding agent. " + "Use the tools well and read files first. " * 12
ASK = [{"role": "user", "content": "list the files"}]
EPHEMERAL = {"type": "ephemeral"}


def system(session: str, **marks) -> list[dict]:
    """Claude Code's system array: the billing block, then the cached prompt."""
    return [
        {"type": "text", "text": BILLING.format(session)},
        {"type": "text", "text": TOOLS_TEXT, **marks},
    ]


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster(context_length=4096)
    await cluster.add_worker("w0", block_size=4)
    return cluster


@pytest.fixture
def sdk(cluster):
    return anthropic.AsyncAnthropic(
        base_url=str(cluster.client.make_url("")), api_key="none", max_retries=0
    )


def worker(cluster):
    return cluster.workers["w0"][0]


async def test_new_sessions_send_the_same_prompt_and_metrics_count_it(cluster, sdk):
    for session in ("e12", "7c0"):
        await sdk.messages.create(model=MODEL, max_tokens=2, system=system(session), messages=ASK)
    first, second = worker(cluster).received
    assert first.token_ids == second.token_ids
    assert "billing" not in cluster.tokenizer.decode(first.token_ids)
    metrics = await (await cluster.client.get("/metrics")).text()
    assert 'mlx_fleet_volatile_prompt_removals_total{model_name="tiny"} 2.0' in metrics


async def test_breakpoints_become_pins_at_their_end(cluster, sdk):
    marks = {"cache_control": {"type": "ephemeral", "ttl": "1h"}}
    turn = [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": EPHEMERAL}]}
    ]
    await sdk.messages.create(
        model=MODEL, max_tokens=2, system=system("e12", **marks), messages=turn
    )
    (sent,) = worker(cluster).received
    at_system, at_turn = sent.pins
    assert (at_system.ttl_s, at_turn.ttl_s) == (3600.0, 300.0)
    text = cluster.tokenizer.decode(sent.token_ids[: at_system.num_tokens])
    assert text.rstrip().endswith(TOOLS_TEXT.strip())  # the system turn, its end marker too
    assert "hi" not in text
    assert at_system.num_tokens < at_turn.num_tokens <= len(sent.token_ids)
    rest = cluster.tokenizer.decode(sent.token_ids[at_turn.num_tokens :])
    assert "hi" not in rest and len(sent.token_ids) - at_turn.num_tokens < 10  # the end markers


@pytest.mark.parametrize(
    "mark, param",
    [
        ({"type": "ephemeral", "ttl": "24h"}, "system[1].cache_control.ttl"),
        ({"type": "persistent"}, "system[1].cache_control"),
        ({"type": "ephemeral", "scope": "global"}, "system[1].cache_control"),
    ],
)
async def test_a_breakpoint_we_cannot_honour_is_a_400_naming_it(cluster, sdk, mark, param):
    with pytest.raises(anthropic.BadRequestError) as caught:
        await sdk.messages.create(
            model=MODEL, max_tokens=2, system=system("e12", cache_control=mark), messages=ASK
        )
    assert param in str(caught.value)
    assert not worker(cluster).received


async def test_five_breakpoints_are_refused(cluster, sdk):
    blocks = [{"type": "text", "text": f"part {i}", "cache_control": EPHEMERAL} for i in range(5)]
    with pytest.raises(anthropic.BadRequestError, match="at most 4"):
        await sdk.messages.create(model=MODEL, max_tokens=2, system=blocks, messages=ASK)


async def test_usage_as_anthropic_counts_it_plain_and_streamed(cluster, sdk):
    body = {"model": MODEL, "max_tokens": 3, "system": system("e12", cache_control=EPHEMERAL)}
    counted = await sdk.messages.count_tokens(model=MODEL, system=body["system"], messages=ASK)
    first = (await sdk.messages.create(**body, messages=ASK)).usage
    (sent,) = worker(cluster).received
    breakpoint_tokens = sent.pins[0].num_tokens
    # nothing cached yet: up to the breakpoint is written, the rest is plain input
    assert first.cache_read_input_tokens == 0
    assert first.cache_creation_input_tokens == breakpoint_tokens
    assert first.input_tokens == len(sent.token_ids) - breakpoint_tokens
    prompt = first.input_tokens + first.cache_read_input_tokens + first.cache_creation_input_tokens
    assert prompt == counted.input_tokens == len(sent.token_ids)

    async with sdk.messages.stream(**body, messages=ASK) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    start = events[0].message.usage
    read = start.cache_read_input_tokens
    assert read >= breakpoint_tokens - 4  # the stand-in caches whole blocks of 4
    assert start.cache_creation_input_tokens == 0  # all before the breakpoint was read
    assert start.input_tokens + read == counted.input_tokens
    assert final.usage.cache_read_input_tokens == read
    assert final.usage.input_tokens == start.input_tokens and final.usage.output_tokens == 3


async def test_without_breakpoints_cached_tokens_are_read_not_input(cluster, sdk):
    body = {"model": MODEL, "max_tokens": 2, "system": TOOLS_TEXT, "messages": ASK}
    await sdk.messages.create(**body)
    usage = (await sdk.messages.create(**body)).usage
    assert usage.cache_read_input_tokens > 0 and usage.cache_creation_input_tokens == 0
    (sent, _) = worker(cluster).received
    assert usage.input_tokens + usage.cache_read_input_tokens == len(sent.token_ids)


async def test_prompt_cache_retention_pins_the_prompt_for_a_day(cluster):
    api = cluster.openai()
    messages = [{"role": "system", "content": TOOLS_TEXT}, *ASK]
    await api.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, extra_body={"prompt_cache_retention": "24h"}
    )
    await api.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=2,
        extra_body={"prompt_cache_retention": "in_memory"},
    )
    day, memory = worker(cluster).received
    assert [(p.num_tokens, p.ttl_s) for p in day.pins] == [(len(day.token_ids), 86400.0)]
    assert memory.pins == ()
    response = await cluster.client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": ASK, "prompt_cache_retention": "forever"},
    )
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "prompt_cache_retention"


def test_a_template_that_writes_the_date_first_is_a_cache_hazard(tiny_model_dir):
    tokenizer = ModelTokenizer.load(tiny_model_dir)
    assert clock_hazard(tokenizer) is None
    tokenizer.set_chat_template(
        (ROOT / "tests" / "data" / "dialects" / "gpt_oss.jinja").read_text()
    )
    hazard = clock_hazard(tokenizer)
    assert hazard is not None and "Current date: 2024-01-02" in hazard
