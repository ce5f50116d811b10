"""Helpers for the Batch API tests: input files as JSONL, a batch polled to its end."""

from __future__ import annotations

import asyncio
import json

MODEL = "tiny"


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def chat_line(custom_id: str, text: str, max_tokens: int = 4, **extra) -> dict:
    body = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


async def finished(api, batch_id: str, timeout: float = 20.0):
    """The batch once it reaches a final status."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        batch = await api.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert asyncio.get_running_loop().time() < deadline, f"still {batch.status}"
        await asyncio.sleep(0.05)


async def lines_of(api, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    text = (await api.files.content(file_id)).text
    return [json.loads(line) for line in text.splitlines()]
