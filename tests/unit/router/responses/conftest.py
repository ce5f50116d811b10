"""A router with stand-in workers scripted to answer /v1/responses bodies with a chosen text."""

from __future__ import annotations

import pytest

from router.api.responses.parse import parse_responses
from router.http import app_keys
from tests.support.scripted import scripted_worker

MODEL = "tiny"
CONTEXT = 4096
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
async def cluster(make_cluster):
    return await make_cluster(context_length=CONTEXT)


def prompt_of(cluster, body: dict) -> tuple[int, ...]:
    store = cluster.app[app_keys.RESPONSES]
    return parse_responses(
        {"model": MODEL, **body}, cluster.tokenizer, MODEL, None, store
    ).prompt_ids


async def scripted(cluster, body: dict, reply: str, end_turn: bool = True):
    """A stand-in answering `body` with `reply`; returns (worker, reply length in tokens)."""
    return await scripted_worker(
        cluster, cluster.tokenizer, prompt_of(cluster, body), reply, end_turn
    )
