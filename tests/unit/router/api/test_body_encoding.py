"""Compressed and mis-encoded request bodies: a 4xx, never a 5xx.

aiohttp decodes `Content-Encoding` itself; bytes that do not decode raised out of
`request.read()` as a 500 until router/http/body.py turned them into a 400.
"""

from __future__ import annotations

import gzip
import json

import pytest

BODIES = {
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "tiny", "prompt": "hi"},
    "/v1/messages": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
}


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    return cluster


def error_message(path: str, body: dict) -> str:
    if path == "/v1/messages":
        assert body["type"] == "error"
    return body["error"]["message"]


@pytest.mark.parametrize("path", BODIES)
async def test_gzip_header_over_plain_bytes_is_400(cluster, path):
    data = json.dumps(BODIES[path] | {"max_tokens": 2}).encode()
    resp = await cluster.client.post(path, data=data, headers={"Content-Encoding": "gzip"})
    assert resp.status == 400
    assert "content-encoding" in error_message(path, await resp.json()).lower()


@pytest.mark.parametrize("path", BODIES)
async def test_gzip_body_is_read(cluster, path):
    data = gzip.compress(json.dumps(BODIES[path] | {"max_tokens": 2}).encode())
    resp = await cluster.client.post(path, data=data, headers={"Content-Encoding": "gzip"})
    assert resp.status == 200, await resp.text()


async def test_gzip_bomb_is_413_not_memory(cluster):
    bomb = gzip.compress(b" " * 100_000_000, compresslevel=9)  # ~100 kB on the wire
    resp = await cluster.client.post(
        "/v1/completions", data=bomb, headers={"Content-Encoding": "gzip"}
    )
    assert resp.status == 413
    assert "larger than" in (await resp.json())["error"]["message"]


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress"])
async def test_encoding_aiohttp_cannot_decode_is_a_400(cluster, encoding):
    # Refused by aiohttp's HTTP layer before any middleware: a plain-text 400 (docs/api.md).
    resp = await cluster.client.post(
        "/v1/completions", data=b"xx", headers={"Content-Encoding": encoding}
    )
    assert 400 <= resp.status < 500
