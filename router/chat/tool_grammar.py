"""`tool_choice` "required" or a named function, enforced: a grammar the worker's constrained
decoding holds the reply to, in the format the model's tool parser reads.

- hermes: one or more `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- llama3: `{"name": ..., "parameters": {...}}`, several joined by `; `;
- mistral: the bare JSON array of calls (its `[TOOL_CALLS]` marker is a special token, which a
  text grammar cannot ask for; the parser reads the bare array too).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

from router.errors import bad_request
from shared.grammar import check_grammar
from shared.sampling import Grammar, InvalidRequest, SamplingParams

if TYPE_CHECKING:
    from router.chat.tools import ToolSet


def call_schema(tools: ToolSet, arguments_key: str = "arguments") -> dict:
    """The JSON schema of one call the tool choice allows."""
    functions = [f["function"] for f in tools.functions]
    if tools.choice != "required":
        functions = [f for f in functions if f["name"] == tools.choice]
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, arguments_key: _closed(f["parameters"])},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for f in functions
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _closed(parameters: dict) -> dict:
    """Arguments hold the declared properties only, unless the schema says otherwise (as
    OpenAI's strict mode): a small model given room invents keys until max_tokens."""
    if "properties" in parameters and "additionalProperties" not in parameters:
        return parameters | {"additionalProperties": False}
    return parameters


def required_call_schema(tools: ToolSet | None) -> dict | None:
    """The schema a call must satisfy when the tool choice demands one (None for "auto")."""
    if tools is None or tools.choice == "auto":
        return None
    return call_schema(tools)


def tool_call_grammar(tools: ToolSet, family: str) -> Grammar:
    """One call (an array of them for Mistral): the reply ends as soon as the grammar is
    complete, so a small model cannot wander into a half-written second call."""
    q = json.dumps  # a JSON string literal is a Lark string literal
    if family == "llama3":
        call = f"%json {q(call_schema(tools, 'parameters'))}"
        return Grammar("lark", f"start: {call}\n")
    if family == "mistral":
        array = {"type": "array", "items": call_schema(tools), "minItems": 1}
        return Grammar("lark", f"start: %json {q(array)}\n")
    call = (
        f"{q('<tool_call>' + chr(10))} %json {q(call_schema(tools))} {q(chr(10) + '</tool_call>')}"
    )
    return Grammar("lark", f"start: {call}\n")


def enforce_tool_choice(
    sampling: SamplingParams, tools: ToolSet | None, family: str | None
) -> SamplingParams:
    """`sampling` with the grammar of a required call; unchanged for "auto" or no tools."""
    if tools is None or tools.choice == "auto" or family is None:
        return sampling
    if sampling.grammar is not None:
        raise bad_request(
            "'response_format' and a required tool call cannot both constrain the reply",
            "tool_choice",
        )
    grammar = tool_call_grammar(tools, family)
    try:
        check_grammar(grammar)
    except InvalidRequest as e:
        raise bad_request(f"a tool's parameters schema: {e}", "tools") from None
    return replace(sampling, grammar=grammar)
