"""`tool_choice` "required" or a named function, enforced: a grammar the worker's constrained
decoding holds the reply to, in the model's own call format (router/chat/dialects/calls.py
gives each format's pieces), so the same dialect reads the call back.

Markers that are added tokens of the model's vocabulary (harmony's channels, Mistral's
[TOOL_CALLS] and [ARGS], Qwen's <tool_call>, Gemma 4's <|"|>) are written as token references
(`<[id]>`): llguidance reads every added token as special, and a string literal cannot match
one. When the template opened
a reasoning block, the grammar closes it first (an empty reasoning, then the call).

Formats without a grammar (kimi_k3, function_gemma, longcat, minicpm5, muse_spark) refuse a
required tool choice with a 400 naming the format: "auto" is served for them.
- Mistral templates without [ARGS] (Nemo, v3) get the bare JSON array of calls, as they write it.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import TYPE_CHECKING

from router.chat.dialects import CALL_FORMATS
from router.chat.dialects.calls import _closed
from router.errors import bad_request
from shared.grammar import check_grammar
from shared.sampling import Grammar, InvalidRequest, SamplingParams

if TYPE_CHECKING:
    from router.chat.dialects.calls import Piece
    from router.chat.prompt import ChatPrompt
    from router.chat.tools import ToolSet
    from router.text.tokenizer import ModelTokenizer


def call_schema(tools: ToolSet, arguments_key: str = "arguments") -> dict:
    """The JSON schema of one call the tool choice allows."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, arguments_key: _closed(f["parameters"])},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for f in _allowed(tools)
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _allowed(tools: ToolSet) -> list[dict]:
    functions = [f["function"] for f in tools.functions]
    if tools.choice != "required":
        functions = [f for f in functions if f["name"] == tools.choice]
    return functions


def required_call_schema(tools: ToolSet | None) -> dict | None:
    """The schema a call must satisfy when the tool choice demands one (None for "auto")."""
    if tools is None or tools.choice == "auto":
        return None
    return call_schema(tools)


def _harmony(name: str, params: dict) -> list[Piece]:
    return [
        ("text", f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"),
        ("json", _closed(params)),
    ]


def tool_call_grammar(
    tools: ToolSet,
    family: str,
    tokenizer: ModelTokenizer | None = None,
    close_reasoning: str = "",
) -> Grammar:
    """One call in `family`'s format (an array of them for Mistral's v3 form): the reply ends
    as soon as the grammar is complete, so a small model cannot wander into a second call."""
    if family == "mistral" and (tokenizer is None or tokenizer.token_id("[ARGS]") is None):
        array = {"type": "array", "items": call_schema(tools), "minItems": 1}
        return Grammar(
            "lark", f"start: {_lark([('text', close_reasoning), ('json', array)], tokenizer)}\n"
        )
    if family == "harmony":
        build = _harmony
    else:
        fmt = CALL_FORMATS.get(family)
        if fmt is None or fmt.grammar is None:
            raise bad_request(
                f"tool_choice 'required' or a named function is not available for this model: "
                f"its tool-call format ({family}) cannot be constrained; use 'auto'",
                "tool_choice",
            )
        build = fmt.grammar
    head: list[Piece] = [("text", close_reasoning)] if close_reasoning else []
    calls = [_lark(head + build(f["name"], f["parameters"]), tokenizer) for f in _allowed(tools)]
    rules = "".join(f"call{i}: {c}\n" for i, c in enumerate(calls))
    alternatives = " | ".join(f"call{i}" for i in range(len(calls)))
    return Grammar("lark", f"start: {alternatives}\n{rules}")


def _lark(pieces: list[Piece], tokenizer: ModelTokenizer | None) -> str:
    out = []
    for kind, value in pieces:
        if kind == "text":
            out += _literal(str(value), tokenizer)
        elif kind == "json":
            out.append(f"%json {json.dumps(value)}")
        else:
            out.append(str(value))
    return " ".join(o for o in out if o)


def _literal(text: str, tokenizer: ModelTokenizer | None) -> list[str]:
    """`text` as Lark: string literals, with its special tokens as token references."""
    if not text:
        return []
    specials = [t for t in (tokenizer.added_tokens if tokenizer else ()) if t and t in text]
    if not specials:
        return [json.dumps(text)]
    pattern = re.compile(
        "(" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")"
    )
    out = []
    for part in pattern.split(text):
        if not part:
            continue
        token_id = tokenizer.token_id(part) if part in specials else None  # type: ignore[union-attr]
        out.append(f"<[{token_id}]>" if token_id is not None else json.dumps(part))
    return out


def enforce_tool_choice(
    sampling: SamplingParams,
    tools: ToolSet | None,
    prompt: ChatPrompt | str | None,
    tokenizer: ModelTokenizer | None = None,
) -> SamplingParams:
    """`sampling` with the grammar of a required call; unchanged for "auto" or no tools.
    `prompt` is the chat prompt (its dialect and whether it opened reasoning), or a family."""
    if tools is None or tools.choice == "auto" or prompt is None:
        return sampling
    if sampling.grammar is not None:
        raise bad_request(
            "'response_format' and a required tool call cannot both constrain the reply",
            "tool_choice",
        )
    if isinstance(prompt, str):
        grammar = tool_call_grammar(tools, prompt, tokenizer)
    else:
        assert prompt.dialect is not None and prompt.tool_family is not None
        close = prompt.dialect.reasoning.close if prompt.starts_in_reasoning else ""
        grammar = tool_call_grammar(tools, prompt.tool_family, tokenizer, close)
    try:
        check_grammar(grammar)
    except InvalidRequest as e:
        raise bad_request(f"a tool's parameters schema: {e}", "tools") from None
    return replace(sampling, grammar=grammar)
