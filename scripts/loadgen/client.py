"""One streaming chat completion against any OpenAI-compatible server, timed.

TTFT is the time from sending the request to the first chunk carrying content text (a first
chunk with only the assistant role does not count). Output tokens come from the final usage
chunk when the server sends one (`stream_options: {"include_usage": true}`), else from the
number of content deltas (one token per delta: exact for servers that stream token by token).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

ERROR_TEXT_LIMIT = 300  # characters of an error body kept in a result


class SSEParser:
    """Bytes of a text/event-stream in, the `data` payload of each complete event out."""

    def __init__(self):
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        events = []
        *lines, self._buffer = self._buffer.split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8")
            if not line:  # a blank line ends an event
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                self._data.append(line[5:].removeprefix(" "))
            # comments (":...") and other fields (event:, id:, retry:) are not used here
        return events

    def close(self) -> list[str]:
        """Whatever event the stream ended inside of (servers that skip the last blank line)."""
        events = self.feed(b"\n\n") if self._buffer or self._data else []
        return events


@dataclass
class RequestResult:
    start: float  # time.perf_counter() when the request was sent
    end: float
    first_token: float | None = None  # when the first content text arrived
    content_deltas: int = 0
    usage_completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    error: str | None = None
    text: str = ""
    chunk_times: list[float] = field(default_factory=list)  # arrival of each content chunk

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return self.content_deltas

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None with fewer than two tokens."""
        if self.first_token is None or self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)

    @property
    def tbt(self) -> list[float]:
        """Times between consecutive content chunks (one token each from a server that streams
        token by token), in seconds: what a reader sees as stalls."""
        times = self.chunk_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]


@dataclass(frozen=True)
class ChatParams:
    model: str
    max_tokens: int = 32
    temperature: float = 0.0
    timeout_s: float = 300.0  # one request, end to end

    def body(self, messages: list[dict]) -> dict:
        return {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


async def stream_chat(
    session: aiohttp.ClientSession, base_url: str, messages: list[dict], params: ChatParams
) -> RequestResult:
    """POST one streaming chat completion; never raises for a failed request (see .error)."""
    result = RequestResult(start=time.perf_counter(), end=0.0)
    try:
        await asyncio.wait_for(
            _exchange(session, base_url, messages, params, result), params.timeout_s
        )
    except asyncio.TimeoutError:
        result.error = f"timed out after {params.timeout_s:g}s"
    except (aiohttp.ClientError, OSError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"[:ERROR_TEXT_LIMIT]
    result.end = time.perf_counter()
    return result


async def _exchange(session, base_url, messages, params: ChatParams, result) -> None:
    url = base_url.rstrip("/") + "/v1/chat/completions"
    async with session.post(url, json=params.body(messages)) as resp:
        if resp.status != 200:
            body = (await resp.text())[:ERROR_TEXT_LIMIT]
            result.error = f"HTTP {resp.status}: {body}"
            return
        parser = SSEParser()
        done = False
        async for chunk in resp.content.iter_any():
            done = _consume(parser.feed(chunk), result)
            if done:
                break
        if not done:
            done = _consume(parser.close(), result)
        if not done and result.error is None:
            result.error = "the stream ended without [DONE]"


def _consume(events: list[str], result: RequestResult) -> bool:
    """Apply events to `result`; True once the stream is over ([DONE])."""
    for data in events:
        if data.strip() == "[DONE]":
            return True
        try:
            apply_chunk(json.loads(data), result, time.perf_counter())
        except (AttributeError, TypeError, KeyError) as e:  # valid JSON, not a chunk's shape
            raise ValueError(f"malformed stream chunk {data[:100]!r}: {e}") from None
    return False


def apply_chunk(chunk: dict, result: RequestResult, now: float) -> None:
    """Fold one parsed stream chunk into `result`."""
    if "error" in chunk:
        error = chunk["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        result.error = f"stream error: {message}"[:ERROR_TEXT_LIMIT]
        return
    for choice in chunk.get("choices") or ():
        content = (choice.get("delta") or {}).get("content")
        if content:
            if result.first_token is None:
                result.first_token = now
            result.content_deltas += 1
            result.chunk_times.append(now)
            result.text += content
    usage = chunk.get("usage")
    if usage:
        result.usage_completion_tokens = usage.get("completion_tokens")
        result.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        result.cached_tokens = details.get("cached_tokens")
