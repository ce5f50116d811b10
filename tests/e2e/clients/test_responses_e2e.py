"""End to end on the default model with real processes: /v1/responses chained over three
turns by previous_response_id (the later turns find the earlier prompt cached), and the
OpenAI Agents SDK's default Responses model running an agent with a function tool."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.e2e.clients.test_agent_api_e2e import wait_healthy
from tests.support.launched import launch_cluster

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
# Long enough to fill a few KV blocks (32 tokens each): a cached prefix counts whole blocks.
INSTRUCTIONS = "You are a patient assistant. " * 12 + "Answer in one short sentence."


@pytest.fixture(scope="module")
def url(model_cache, tmp_path_factory):
    # Two workers: a previous_response_id chain is routed by its conversation's key, so every
    # turn reaches the worker that holds the conversation (before that key the third turn was
    # measured landing on the other worker: 0 of 149 tokens cached).
    logs = tmp_path_factory.mktemp("responses-logs")
    # the router's stored responses in a folder of the test's own, not the user's cache
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path_factory.mktemp("responses-cache")))
    with launch_cluster(["--workers", "2", "--kv-memory", "256MiB"], logs, env=env) as (base, _):
        wait_healthy(base)
        _wait_for_workers(base, 2)
        yield base


def _wait_for_workers(url: str, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            if json.loads(r.read())["healthy_workers"] >= count:
                return
        time.sleep(0.5)
    raise AssertionError(f"fewer than {count} healthy workers after {timeout}s")


def test_three_turns_by_previous_response_id_hit_the_cache(url):
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    previous, shares = None, []
    for question in ("My name is Ann. Say hello.", "What is 2 + 2?", "What is my name?"):
        resp = api.responses.create(
            model=MODEL,
            input=question,
            max_output_tokens=24,
            temperature=0,
            instructions=INSTRUCTIONS,
            previous_response_id=previous,
        )
        assert resp.status in ("completed", "incomplete") and resp.output_text
        cached = resp.usage.input_tokens_details.cached_tokens
        shares.append((cached, resp.usage.input_tokens))
        previous = resp.id
    print("cached/input tokens per turn:", shares)
    assert shares[1][0] > 0 and shares[2][0] > 0
    # the third turn finds the second's prompt and reply (measured 128 of 149; before the
    # scheduler inserted a finished reply's blocks whole, 96)
    assert shares[2][0] > shares[1][0]
    assert shares[2][1] > shares[1][1] > shares[0][1]  # each turn carries the earlier ones
    items = api.responses.input_items.list(previous)
    assert [i.content[0].text for i in items.data] == ["What is my name?"]


def test_agents_sdk_runs_a_function_tool_to_a_final_output(url):
    agents = pytest.importorskip("agents")
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    agent = agents.Agent(
        name="weather",
        instructions="Use the get_weather tool.",
        tools=[get_weather],
        model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=80),
        tool_use_behavior="stop_on_first_tool",
    )
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=2)
    assert len(calls) == 1
    assert result.final_output == f"Sunny in {calls[0]}"


VERDICT = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}


def test_json_schema_text_format_gives_20_of_20_valid_objects(url):
    """20 sampled replies (sent at once, so they batch) all parse and validate: the grammar,
    not luck, makes them objects of the schema (whose every string is an enum and every number
    bounded, so no draw can run past max_output_tokens)."""
    import jsonschema

    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    fmt = {"type": "json_schema", "name": "verdict", "schema": VERDICT, "strict": True}

    def ask(_):
        return api.responses.create(
            model=MODEL,
            input="Is Paris the capital of France? Answer as JSON.",
            text={"format": fmt},
            temperature=0.8,
            max_output_tokens=60,
        )

    with ThreadPoolExecutor(max_workers=20) as pool:
        replies = list(pool.map(ask, range(20)))
    for resp in replies:
        assert resp.status == "completed", resp.output_text
        jsonschema.validate(json.loads(resp.output_text), VERDICT)
