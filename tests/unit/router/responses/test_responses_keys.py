"""With API keys, a stored response is its key's own: another key reading, listing, deleting or
continuing it gets what an unknown id gets."""

from __future__ import annotations

import openai
import pytest

from router.http import app_keys
from router.http.api_keys import key_fingerprint
from tests.support.scripted import scripted_worker
from tests.unit.router.responses.conftest import MODEL, prompt_of

KEY_A, KEY_B = "key-a-0123456789", "key-b-9876543210"


async def test_stored_responses_are_scoped_to_their_key(make_cluster):
    cluster = await make_cluster(api_keys=(KEY_A, KEY_B))

    async def script(body, reply, key):
        prompt = await prompt_of(cluster, body, key_fingerprint(key))
        await scripted_worker(cluster, cluster.tokenizer, prompt, reply)

    body = {"input": "hi", "max_output_tokens": 20}
    await script(body, "Hello.", KEY_A)
    url = cluster.base_url()
    async with (
        openai.AsyncOpenAI(base_url=url, api_key=KEY_A, max_retries=0) as a,
        openai.AsyncOpenAI(base_url=url, api_key=KEY_B, max_retries=0) as b,
    ):
        resp = await a.responses.create(model=MODEL, **body)
        for call in (
            b.responses.retrieve,
            b.responses.input_items.list,
            b.responses.delete,
            b.responses.cancel,
        ):
            for rid in (resp.id, "resp_nope"):  # the same 404 as an unknown id
                with pytest.raises(openai.NotFoundError) as e:
                    await call(rid)
                assert e.value.body["message"] == f"Response with id '{rid}' not found."
        with pytest.raises(openai.BadRequestError) as e:
            await b.responses.create(model=MODEL, input="and?", previous_response_id=resp.id)
        assert e.value.body["code"] == "previous_response_not_found"
        # A still has it (B's delete did nothing), continues it and deletes it
        assert (await a.responses.retrieve(resp.id)).output_text == "Hello."
        items = await a.responses.input_items.list(resp.id)
        assert [i.content[0].text for i in items.data] == ["hi"]
        turn = {"input": "and?", "previous_response_id": resp.id, "max_output_tokens": 20}
        await script(turn, "Bye.", KEY_A)
        assert (await a.responses.create(model=MODEL, **turn)).output_text == "Bye."
        await a.responses.delete(resp.id)
        with pytest.raises(openai.NotFoundError):
            await a.responses.retrieve(resp.id)


async def test_without_keys_one_store_is_shared(make_cluster):
    cluster = await make_cluster()
    body = {"input": "hi", "max_output_tokens": 20}
    store = cluster.app[app_keys.RESPONSES]
    await scripted_worker(cluster, cluster.tokenizer, await prompt_of(cluster, body), "Hello.")
    one, other = cluster.openai(), cluster.openai()
    resp = await one.responses.create(model=MODEL, **body)
    assert (await other.responses.retrieve(resp.id)).output_text == "Hello."
    assert (await store.get(resp.id, None)).owner is None  # kept as nobody's: keys are off
