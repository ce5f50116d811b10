"""Tool calls out of model text, for the common output families.

- hermes  (Hermes, Qwen 2.5/3, and our fallback prompt): `<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`, any number of them, text around them is content.
- llama3: the whole reply is `{"name": ..., "parameters": {...}}` (optionally after
  `<|python_tag|>`; several calls may be joined by `;`).
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (the marker may be a special
  token the decoder drops, so a reply that *is* such an array counts too).

A call that does not parse comes back as plain content, never an error: the model wrote it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from router.text import strict_json
from shared.config.choices import TOOL_CALL_PARSERS

PARSER_NAMES = TOOL_CALL_PARSERS  # one parser each below


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's `function.arguments`)


@dataclass(frozen=True)
class ToolParse:
    content: str
    calls: tuple[ParsedCall, ...]


def parse_tool_calls(family: str, text: str) -> ToolParse:
    """Split a whole reply into content and calls; malformed calls stay content."""
    return _PARSERS[family](text)


def call_region_start(family: str, text: str, at_reply_start: bool) -> int | None:
    """Where in `text` a tool-call region certainly begins, or None. Llama 3 and Mistral
    calls may also be a bare JSON object / array, but only as the whole reply."""
    if family == "hermes":
        i = text.find(HERMES_OPEN)
        return i if i >= 0 else None
    marker = LLAMA3_TAG if family == "llama3" else MISTRAL_TAG
    if (i := text.find(marker)) >= 0:
        return i
    stripped = text.lstrip()
    opener = "{" if family == "llama3" else "["
    if at_reply_start and stripped.startswith(opener):
        return len(text) - len(stripped)
    return None


def possible_marker_prefix(family: str, text: str, at_reply_start: bool) -> int:
    """How many characters at the end of `text` might begin a call region (hold them back)."""
    if at_reply_start and not text.strip():
        return len(text)  # only whitespace so far: the reply may still open with a call
    markers = {"hermes": HERMES_OPEN, "llama3": LLAMA3_TAG, "mistral": MISTRAL_TAG}
    marker = markers[family]
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def complete_hermes_calls(region: str) -> int:
    """How many `<tool_call>...</tool_call>` blocks in `region` are closed."""
    return region.count(HERMES_CLOSE)


# ------------------------------------------------------------ families

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LLAMA3_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def _parse_hermes(text: str) -> ToolParse:
    calls, content, last = [], [], 0
    for match in _HERMES_BLOCK.finditer(text):
        call = _call_from_json(match.group(1))
        if call is None:
            continue  # left in the content as written
        content.append(text[last : match.start()])
        last = match.end()
        calls.append(call)
    content.append(text[last:])
    return ToolParse("".join(content).strip() if calls else text, tuple(calls))


def _parse_llama3(text: str) -> ToolParse:
    body = text.split(LLAMA3_TAG, 1)[1] if LLAMA3_TAG in text else text
    head = text.split(LLAMA3_TAG, 1)[0] if LLAMA3_TAG in text else ""
    calls = []
    for part in _split_top_level(body.strip(), ";"):
        call = _call_from_json(part)
        if call is None:
            return ToolParse(text, ())
        calls.append(call)
    return ToolParse(head.strip(), tuple(calls)) if calls else ToolParse(text, ())


def _parse_mistral(text: str) -> ToolParse:
    head, _, body = text.partition(MISTRAL_TAG) if MISTRAL_TAG in text else ("", "", text)
    try:
        items = strict_json.loads(body.strip())
    except ValueError:
        return ToolParse(text, ())
    if isinstance(items, dict):
        items = [items]
    calls = [_call_from_value(item) for item in items] if isinstance(items, list) else [None]
    if not calls or None in calls:
        return ToolParse(text, ())
    return ToolParse(head.strip(), tuple(calls))


_PARSERS = {"hermes": _parse_hermes, "llama3": _parse_llama3, "mistral": _parse_mistral}


def _call_from_json(text: str) -> ParsedCall | None:
    try:
        value = strict_json.loads(text.strip())
    except ValueError:
        return None
    return _call_from_value(value)


def _call_from_value(value) -> ParsedCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments already encoded
        try:
            arguments = strict_json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _split_top_level(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside JSON strings and brackets."""
    parts, depth, start, in_string, escaped = [], 0, 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]
