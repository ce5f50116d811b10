"""API-key headers holding bytes that are not UTF-8: a 401 with an error body, never a 500.

aiohttp's test client will not send such bytes, so the request is written on a raw socket.
"""

from __future__ import annotations

import asyncio
import json

import pytest

KEY = "sk-right"
BODY = b'{"model":"tiny","prompt":"hi","max_tokens":2}'


async def raw_post(cluster, path: str, header_line: bytes) -> tuple[int, dict]:
    server = cluster.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\nConnection: close\r\n"
    ).encode()
    writer.write(head + header_line + b"\r\n\r\n" + BODY)
    await writer.drain()
    response = await reader.read()
    writer.close()
    status_line, _, rest = response.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster(api_keys=(KEY,))
    await cluster.add_worker("w1")
    return cluster


@pytest.mark.parametrize(
    "header_line",
    [b"x-api-key: \xff\xfe", b"Authorization: Bearer \xff", b"Authorization: Bearer sk-\xc3("],
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/messages"])
async def test_non_utf8_key_is_401(cluster, path, header_line):
    status, body = await raw_post(cluster, path, header_line)
    assert status == 401
    assert body["error"]["message"]
    assert (body.get("type") == "error") == (path == "/v1/messages")


async def test_the_right_key_on_a_raw_socket_is_accepted(cluster):
    status, body = await raw_post(cluster, "/v1/completions", b"x-api-key: " + KEY.encode())
    assert status == 200 and body["object"] == "text_completion"
