"""--tokenizer-threads: prompts are parsed and tokenized off the event loop, with the same
tokens and the same 4xx errors as on it."""

from __future__ import annotations

import threading

from router.http import app_keys

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}


async def prompt_tokens(cluster, path: str, body: dict) -> int:
    resp = await cluster.client.post(path, json=body)
    assert resp.status == 200, await resp.text()
    usage = (await resp.json())["usage"]
    return usage.get("prompt_tokens", usage.get("input_tokens"))


async def test_off_loop_tokenization_gives_the_same_prompt_and_errors(make_cluster, monkeypatch):
    on_loop = await make_cluster()
    await on_loop.add_worker("w1")
    pooled = await make_cluster(tokenizer_threads=2)
    await pooled.add_worker("w1")
    assert on_loop.app[app_keys.TOKENIZE_POOL] is None
    assert pooled.app[app_keys.TOKENIZE_POOL] is not None

    tokenizer = pooled.tokenizer
    threads = []
    encode = tokenizer.encode_text
    monkeypatch.setattr(
        tokenizer,
        "encode_text",
        lambda text: threads.append(threading.current_thread().name) or encode(text),
    )
    expected = await prompt_tokens(on_loop, "/v1/chat/completions", CHAT)
    assert await prompt_tokens(pooled, "/v1/chat/completions", CHAT) == expected
    anthropic_body = {**CHAT, "model": "tiny"}
    assert await prompt_tokens(pooled, "/v1/messages", anthropic_body) > 0
    assert threads and all(name.startswith("tokenize") for name in threads)

    bad = await pooled.client.post("/v1/chat/completions", json={**CHAT, "messages": "hi"})
    assert bad.status == 400
    assert "error" in await bad.json()
