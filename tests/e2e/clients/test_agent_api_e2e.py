"""End to end on the default model with real processes: a tools request through the openai SDK
and a /v1/messages request through the anthropic SDK. Shapes and status, not the model's words."""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import anthropic
import openai
import pytest

from tests.support.launched import launch_cluster

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def wait_healthy(url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if json.loads(r.read())["healthy_workers"] >= 1:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"no healthy worker after {timeout}s")


@pytest.fixture(scope="module")
def url(model_cache, tmp_path_factory):
    logs = tmp_path_factory.mktemp("agent-api-logs")
    with launch_cluster(["--workers", "1", "--kv-memory", "256MiB"], logs) as (base, _):
        wait_healthy(base)
        yield base


def test_tools_request_and_round_trip(url):
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    resp = api.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], max_tokens=60, temperature=0
    )
    choice = resp.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)
    for call in choice.message.tool_calls or []:
        assert call.id.startswith("call_") and isinstance(json.loads(call.function.arguments), dict)
    history = [
        *messages,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
    ]
    stream = api.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], max_tokens=30, stream=True
    )
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_anthropic_messages_request(url):
    api = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    msg = api.messages.create(
        model=MODEL,
        max_tokens=30,
        system="You are brief.",
        messages=[{"role": "user", "content": "Name a color."}],
    )
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.usage.input_tokens > 0 and 0 < msg.usage.output_tokens <= 30
    with api.messages.stream(
        model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "Say hi."}]
    ) as stream:
        types = [event.type for event in stream]
    assert types[0] == "message_start" and types[-1] == "message_stop"


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_required_and_named_choices_always_yield_a_valid_call(url, choice):
    """Enforced by the grammar, not hoped for: 135M parameters never call tools unasked.
    The three questions are asked at once: one batch, each row its own grammar."""
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

    def ask(question: str):
        return api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            tools=[WEATHER],
            tool_choice=choice,
            max_tokens=80,
            seed=1,  # sampled, but the same draw every run: a long string argument could
            # otherwise run a random draw into max_tokens now and then
        )

    questions = ("Weather in Paris?", "Tell me a joke.", "Is it cold in Oslo today?")
    with ThreadPoolExecutor(len(questions)) as pool:
        replies = list(pool.map(ask, questions))
    for resp in replies:
        choice0 = resp.choices[0]
        assert choice0.finish_reason == "tool_calls", choice0
        (call,) = choice0.message.tool_calls
        assert call.function.name == "get_weather"
        assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_a_new_agent_session_reads_the_shared_prompt_from_cache(url):
    """Claude Code's shape on the real model: a billing block that differs per session, a long
    system prompt with a cache_control breakpoint; the second session reads that prompt from
    cache, usage adds up as Anthropic's does, and the worker holds the pin."""
    api = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=300)
    rules = "Read the file before editing it. Keep changes small and test them. " * 40

    def system(session: str) -> list[dict]:
        billing = f"x-anthropic-billing-header: cc_version=2.1.197.{session}; cc_entrypoint=cli;"
        return [
            {"type": "text", "text": billing},
            {"type": "text", "text": rules, "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        ]

    def ask(session: str, question: str):
        body = {"model": MODEL, "max_tokens": 4, "system": system(session)}
        messages = [{"role": "user", "content": question}]
        counted = api.messages.count_tokens(
            model=MODEL, system=body["system"], messages=messages
        ).input_tokens
        with api.messages.stream(**body, messages=messages) as stream:
            start = next(iter(stream)).message.usage
            final = stream.get_final_message().usage
        return counted, start, final

    counted, start, first = ask("e12", "What should I do first?")
    parts = (first.input_tokens, first.cache_read_input_tokens, first.cache_creation_input_tokens)
    assert sum(parts) == counted and first.cache_creation_input_tokens > counted // 2
    counted, start, second = ask("7c0", "Which file is the largest?")
    assert second.cache_read_input_tokens >= 0.9 * counted  # the new session's first request
    assert start.cache_read_input_tokens == second.cache_read_input_tokens
    assert second.cache_creation_input_tokens == 0
    assert second.input_tokens + second.cache_read_input_tokens == counted
    with urllib.request.urlopen(f"{url}/v1/cluster", timeout=10) as r:
        workers = json.loads(r.read())["workers"]
    assert sum(w["kv_pins"] for w in workers) >= 1
