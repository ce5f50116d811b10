"""Tool calls out of a whole reply's text, by call format (router/chat/dialects/calls.py has
the formats; router/chat/output.py reads them as they stream). Kept for callers that have a
whole text and a format's name: the same reader, fed at once.

A call that does not parse comes back as plain content, never an error: the model wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.chat.dialects import TOOL_PARSER_NAMES, ParsedCall
from router.chat.output import ChatReader

PARSER_NAMES = TOOL_PARSER_NAMES

__all__ = ["PARSER_NAMES", "ParsedCall", "ToolParse", "parse_tool_calls"]


@dataclass(frozen=True)
class ToolParse:
    content: str
    calls: tuple[ParsedCall, ...]


def parse_tool_calls(family: str, text: str) -> ToolParse:
    """Split a whole reply into content and calls; malformed calls stay content."""
    reader = ChatReader(family)
    events = reader.feed(text) + reader.finish()
    calls = tuple(e.call for e in events if e.call is not None)
    content = "".join(e.text for e in events if e.kind != "tool_call")
    return ToolParse(content.strip() if calls else content, calls)
