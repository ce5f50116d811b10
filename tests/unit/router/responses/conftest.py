"""A router with stand-in workers scripted to answer /v1/responses bodies with a chosen text."""

from __future__ import annotations

import pytest

from router.api.responses.parse import parse_responses
from router.api.responses.store import ScopedStore
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


async def view_of(cluster, body: dict, owner: str | None = None) -> ScopedStore:
    """The store as a request with `body` sees it (its previous_response_id loaded)."""
    view = ScopedStore(owner)
    previous = body.get("previous_response_id")
    stored = previous and await cluster.app[app_keys.RESPONSES].get(previous, owner)
    if stored:
        view.loaded[previous] = stored
    return view


async def prompt_of(cluster, body: dict, owner: str | None = None) -> tuple[int, ...]:
    view = await view_of(cluster, body, owner)
    return parse_responses(
        {"model": MODEL, **body}, cluster.tokenizer, MODEL, None, view
    ).prompt_ids


async def scripted(cluster, body: dict, reply: str, end_turn: bool = True):
    """A stand-in answering `body` with `reply`; returns (worker, reply length in tokens)."""
    return await scripted_worker(
        cluster, cluster.tokenizer, await prompt_of(cluster, body), reply, end_turn
    )
