"""A previous_response_id chain is routed by its conversation: every turn goes to the worker
that served the first (its KV holds the conversation), even where the prompt alone would not
say so."""

from __future__ import annotations

from router.http import app_keys
from tests.unit.router.responses.conftest import MODEL


async def test_chained_turns_share_a_routing_key(cluster):
    await cluster.add_worker("w1")
    api = cluster.openai()
    first = await api.responses.create(model=MODEL, input="hi", max_output_tokens=3)
    second = await api.responses.create(
        model=MODEL, input="again", max_output_tokens=3, previous_response_id=first.id
    )
    store = cluster.app[app_keys.RESPONSES]
    key = (await store.get(first.id, None)).cache_key
    assert key is not None and (await store.get(second.id, None)).cache_key == key
    keyed = await api.responses.create(
        model=MODEL, input="x", max_output_tokens=3, prompt_cache_key="tenant-7"
    )
    assert (await store.get(keyed.id, None)).cache_key == "tenant-7"  # the client's own key wins
    unstored = await api.responses.create(model=MODEL, input="x", max_output_tokens=3, store=False)
    assert await store.get(unstored.id, None) is None


async def test_a_chained_turn_goes_where_the_first_went(cluster):
    """New instructions on every turn: no prompt shares a prefix with the last, so only the
    conversation's key can keep the turns on one worker (prefix routing alone alternates
    between two idle workers that both miss)."""
    workers = [await cluster.add_worker(w) for w in ("w1", "w2")]
    api = cluster.openai()
    previous = None
    for turn, style in enumerate(("Terse", "Verbose", "Formal", "Casual")):
        resp = await api.responses.create(
            model=MODEL,
            input=f"question {turn}",
            instructions=f"{style} answers. " * 8,
            max_output_tokens=3,
            previous_response_id=previous,
        )
        previous = resp.id
    served = [len(w.received) for w in workers]
    assert sorted(served) == [0, 4], served
