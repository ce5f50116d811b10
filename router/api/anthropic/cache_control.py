"""Anthropic's `cache_control` breakpoints, read with the body (router/api/anthropic/parse.py).

A breakpoint `{"type": "ephemeral", "ttl": "5m" | "1h"}` on a tool, a system block or a
message's block asks that the prompt up to there stay cached for the TTL (renewed by each
use). Each becomes a cut of the normalised conversation; router/chat/prompt.py finds where
the cut stops agreeing with the whole prompt, in tokens, and the request carries
`CachePin(tokens, ttl)` for the worker to keep (shared/protocol.py). The last breakpoint also
splits Anthropic's usage: tokens written to cache before it are `cache_creation_input_tokens`
(router/api/anthropic/render.py). A TTL we cannot keep, or a fifth breakpoint, is a 400.
"""

from __future__ import annotations

from router.errors import bad_request

CACHE_TTLS = {"5m": 300.0, "1h": 3600.0}
MAX_BREAKPOINTS = 4  # Anthropic's limit
_KEYS = {"type", "ttl"}


class Breakpoints:
    """The request's cache_control marks as it is read: for each, its TTL and the normalised
    conversation cut where it ends (router/chat/prompt.py finds that point in the prompt).

    A mark on a system block ends at that block; on a message's block, at the end of the
    message (its tool results and text); on a tool, before the system prompt (conservative:
    templates place tools differently)."""

    def __init__(self):
        self.cuts: list[list[dict]] = []
        self.ttls: list[float] = []

    def add(self, mark, param: str, cut: list[dict]) -> None:
        if not isinstance(mark, dict) or mark.get("type") != "ephemeral" or mark.keys() - _KEYS:
            raise bad_request(
                f'\'{param}\' must be {{"type": "ephemeral"}}, with an optional "ttl" of '
                f"{' or '.join(repr(t) for t in CACHE_TTLS)}",
                param,
            )
        ttl = mark.get("ttl", "5m")
        if ttl not in CACHE_TTLS:
            raise bad_request(
                f"'{param}.ttl' {ttl!r} cannot be honoured: cached prefixes are kept for "
                f"{' or '.join(repr(t) for t in CACHE_TTLS)}",
                f"{param}.ttl",
            )
        if len(self.ttls) == MAX_BREAKPOINTS:
            raise bad_request(
                f"at most {MAX_BREAKPOINTS} blocks may carry cache_control ({param} is one more)",
                param,
            )
        self.cuts.append(cut)
        self.ttls.append(CACHE_TTLS[ttl])

    def tools(self, tools) -> None:
        for i, tool in enumerate(tools if isinstance(tools, list) else []):
            if isinstance(tool, dict) and tool.get("cache_control") is not None:
                self.add(tool["cache_control"], f"tools[{i}].cache_control", [])

    @staticmethod
    def marks_in(content, param: str) -> list[tuple[object, str]]:
        """(mark, its parameter name) of every block of a message's content that carries one,
        a tool_result's own content blocks included; checked when added."""
        found = []
        for j, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                continue
            if block.get("cache_control") is not None:
                found.append((block["cache_control"], f"{param}[{j}].cache_control"))
            inner = block.get("content") if block.get("type") == "tool_result" else None
            for k, part in enumerate(inner if isinstance(inner, list) else []):
                if isinstance(part, dict) and part.get("cache_control") is not None:
                    found.append(
                        (part["cache_control"], f"{param}[{j}].content[{k}].cache_control")
                    )
        return found
