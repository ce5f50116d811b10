"""The soak's open-loop traffic: Poisson arrivals of a mix of request kinds, each sorted into
one outcome.

Outcomes: completed; failed (a clear error: an API-style error body with a 4xx/5xx, or an
error event in the stream); abandoned (the client closed the stream on purpose); refused (the
router was down: connection refused); dropped_by_router_kill (the connection broke while the
router was being killed and restarted: the process holding the socket died, nothing can answer);
lost (the connection broke, or a 200 was not a whole answer, with no error); hung (no answer
within the deadline). Lost and hung are the defects.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import aiohttp

from scripts.loadgen.client import SSEParser
from scripts.loadgen.workloads import Shape, multi_tenant, paragraph, question

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
# kind: weight; hostile kinds expect a 4xx
MIX = {
    "chat": 3,
    "chat_stream": 4,
    "long_prompt": 2,
    "tools": 2,
    "n2": 1,
    "n2_stream": 1,
    "abandon": 2,
    "bad_json": 1,
    "unknown_field": 1,
    "huge_number": 1,
}
HOSTILE = {"bad_json", "unknown_field", "huge_number"}


@dataclass
class Tally:
    outcomes: Counter = field(default_factory=Counter)
    by_kind: dict = field(default_factory=lambda: defaultdict(Counter))
    hostile_not_4xx: int = 0
    examples: dict = field(default_factory=dict)  # outcome -> one error text

    def add(self, kind: str, outcome: str, detail: str = "") -> None:
        self.outcomes[outcome] += 1
        self.by_kind[kind][outcome] += 1
        if detail and outcome != "completed":
            self.examples.setdefault(outcome, f"{kind}: {detail}"[:300])

    def to_json(self) -> dict:
        return {
            "total": sum(self.outcomes.values()),
            "by_outcome": dict(self.outcomes),
            "by_kind": {k: dict(v) for k, v in sorted(self.by_kind.items())},
            "hostile_not_4xx": self.hostile_not_4xx,
            "examples": self.examples,
        }


class Traffic:
    """Sends requests at Poisson times until stopped; `router_down` (a callable) says whether
    a router kill is under way, to tell its dropped connections from lost ones."""

    def __init__(self, url, model, rate, deadline_s, max_tokens, seed, router_down):
        self.url, self.model, self.rate = url, model, rate
        self.deadline_s, self.max_tokens = deadline_s, max_tokens
        self.rng = random.Random(seed)
        self.router_down = router_down
        self.tally = Tally()
        shape = Shape(tenants=3, prefix_words=400)
        self.long_prompts = [p.messages for p in multi_tenant(24, seed, shape)]
        self.tasks: set[asyncio.Task] = set()

    async def run(self, until: float) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            kinds, weights = list(MIX), list(MIX.values())
            while (now := time.monotonic()) < until:
                await asyncio.sleep(min(self.rng.expovariate(self.rate), until - now))
                kind = self.rng.choices(kinds, weights)[0]
                task = asyncio.create_task(self.one(session, kind))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            if self.tasks:
                await asyncio.wait(set(self.tasks))

    async def one(self, session, kind: str) -> None:
        body, raw = self.body(kind)
        down_at_start = self.router_down()
        try:
            outcome, detail = await asyncio.wait_for(
                self.exchange(session, kind, body, raw), self.deadline_s
            )
        except asyncio.TimeoutError:
            outcome, detail = "hung", f"no answer within {self.deadline_s:g}s"
        except aiohttp.ClientConnectorError as e:
            outcome, detail = "refused", str(e)
        except (aiohttp.ClientError, OSError) as e:
            broke = down_at_start or self.router_down()
            outcome, detail = ("dropped_by_router_kill" if broke else "lost"), repr(e)
        self.tally.add(kind, outcome, detail)

    def body(self, kind: str) -> tuple[dict | None, bytes | None]:
        rng = self.rng
        messages = [{"role": "user", "content": question(rng, 8) + " " + paragraph(rng, 12)}]
        body = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens}
        if kind in ("chat_stream", "abandon", "n2_stream"):
            body["stream"] = True
        if kind in ("n2", "n2_stream"):
            body |= {"n": 2, "temperature": 0.8}
        if kind == "long_prompt":
            body["messages"] = rng.choice(self.long_prompts)
            body["stream"] = rng.random() < 0.5
        if kind == "tools":
            body["tools"] = TOOLS
            body["messages"] = [{"role": "user", "content": "What is the weather in Oslo?"}]
        if kind == "abandon":
            body["max_tokens"] = max(64, self.max_tokens * 4)
        if kind == "unknown_field":
            body["frobnicate_level"] = 11
        if kind == "huge_number":
            body["max_tokens"] = 10**40
        if kind == "bad_json":
            return None, b'{"model": "' + self.model.encode() + b'", "messages": [{"role": '
        return body, None

    async def exchange(self, session, kind, body, raw) -> tuple[str, str]:
        url = f"{self.url}/v1/chat/completions"
        kwargs = {"json": body} if raw is None else {"data": raw}
        headers = {"Content-Type": "application/json"}
        async with session.post(url, headers=headers, **kwargs) as resp:
            if kind in HOSTILE and not 400 <= resp.status < 500:
                self.tally.hostile_not_4xx += 1
            if resp.status != 200:
                return await error_outcome(resp)
            if body.get("stream"):
                return await self.stream(resp, kind == "abandon")
            try:
                answer = await resp.json(content_type=None)
            except (ValueError, aiohttp.ClientPayloadError) as e:
                return "lost", f"a 200 that is not JSON: {e!r}"
            want = body.get("n", 1)
            if len(answer.get("choices") or ()) != want:
                return "lost", f"a 200 without {want} choices: {str(answer)[:200]}"
            return "completed", ""

    async def stream(self, resp, abandon: bool) -> tuple[str, str]:
        parser = SSEParser()
        async for chunk in resp.content.iter_any():
            for data in parser.feed(chunk):
                if data.strip() == "[DONE]":
                    return "completed", ""
                event = json.loads(data)
                if "error" in event:
                    return "failed", f"stream error: {str(event['error'])[:200]}"
                if abandon and any(
                    (c.get("delta") or {}).get("content") for c in event.get("choices") or ()
                ):
                    resp.close()  # the client walks away mid-stream
                    return "abandoned", ""
        return "lost", "the stream ended without [DONE] or an error event"


async def error_outcome(resp) -> tuple[str, str]:
    text = await resp.text()
    try:
        clear = isinstance(json.loads(text).get("error"), dict)
    except (ValueError, AttributeError):
        clear = False
    why = "" if clear else " (not an API-style error body)"
    return "failed", f"HTTP {resp.status}{why}: {text[:200]}"
