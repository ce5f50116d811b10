"""Responses `tools` / `tool_choice` in chat terms: function tools only, flat
(`{"type": "function", "name", "description", "parameters", "strict"}`), checked by
router/chat/tools.py like the chat endpoint's; any other tool type is a 400 naming it."""

from __future__ import annotations

from router.chat.tools import ToolSet, parse_tools
from router.errors import bad_request


def responses_tools(body: dict) -> ToolSet | None:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("'tools' must be an array of function tools", "tools")
    functions = [_function(tool, i) for i, tool in enumerate(tools or [])]
    return parse_tools({"tools": functions, "tool_choice": _tool_choice(body.get("tool_choice"))})


def _function(tool, i: int) -> dict:
    param = f"tools[{i}]"
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise bad_request(
            f"{param}: tool type {kind!r} is not supported; only 'function' tools are", param
        )
    strict = tool.get("strict")
    if strict is not None and type(strict) is not bool:
        raise bad_request(f"{param}.strict must be a boolean", f"{param}.strict")
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice):
    """auto | none | required | {"type": "function", "name": ...}, as chat spells them."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise bad_request(
        f"'tool_choice' {kind!r} is not supported: 'auto', 'none', 'required' or "
        '{"type": "function", "name": ...}',
        "tool_choice",
    )
