"""How each family writes a tool call: the markers around a call region, how the text inside
becomes calls, and the grammar that makes a model write one (tool_choice "required" / named).

A region opens at `start` and closes at `end` ("" = at the end of the reply); some families put
several calls in one region, each closed by `item_end`, and those calls go out as each closes.
The text inside goes to the family's parser: mlx-lm's own (`mlx_lm/tool_parsers/`, loaded by
dialects/library.py) wherever it has one, ours for the families it lacks (hermes, Llama 3 JSON,
DeepSeek V3 / R1 / V3.1, Nemotron Nano v2's JSON array; gpt-oss's harmony is a reader of its
own, dialects/harmony.py). Seed-OSS writes Qwen3-Coder's XML call inside markers of its own:
the region's text goes to mlx-lm's qwen3_coder parser.

A region whose text does not parse stays the model's text (content), never an error; so does a
call to a function the request did not declare.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.chat.dialects.library import mlx_lm_parser
from router.text import strict_json

if TYPE_CHECKING:
    from router.chat.tools import ToolSet


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's `function.arguments`)


@dataclass(frozen=True)
class CallFormat:
    name: str
    start: str  # the marker that opens a call region
    end: str  # the marker that closes it; "" = the region runs to the end of the reply
    parse: Callable[[str, list[dict]], list[dict]]  # region text -> [{name, arguments}]
    source: str  # where the parser comes from: "mlx-lm" or "mlx-fleet"
    item_end: str = ""  # inside a region, the marker after each call (they stream as closed)
    bare_start: str = ""  # a reply that opens with this (no marker) is a region too
    # the text of one call, as Lark pieces over (function name, its parameters schema)
    grammar: Callable[[str, dict], list[Piece]] | None = None
    example: str = ""  # a reply with one call, for docs/api.md

    def calls(self, region: str, tools: ToolSet | None) -> list[ParsedCall] | None:
        """The calls in a region's text (markers cut off), or None when it is not a call."""
        declared = {f["function"]["name"] for f in tools.functions} if tools else None
        schemas = [dict(f) for f in tools.functions] if tools else []
        try:
            found = self.parse(region, schemas)
        except Exception:  # the parsers raise whatever their regex or json met: not a call
            return None
        found = found if isinstance(found, list) else [found]
        out = [_call(c, declared) for c in found]
        return None if not out or None in out else out  # type: ignore[return-value]


# A grammar piece: ("text", s) a literal the tokenizer may write with special tokens in it;
# ("json", schema) a JSON value; ("lark", s) Lark as written; ("alt", [[pieces], ...]).
Piece = tuple[str, object]


def _call(value, declared: set[str] | None) -> ParsedCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    name = value["name"]
    if declared is not None and name not in declared:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some write the arguments already encoded
        try:
            arguments = strict_json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


# ------------------------------------------------------------ parsers of our own


def _json_call(text: str) -> dict:
    value = strict_json.loads(text.strip())
    if not isinstance(value, dict):
        raise ValueError("not a call object")
    return value


def _parse_hermes(text: str, _tools) -> list[dict]:
    return [_json_call(text)]


def _parse_llama3(text: str, _tools) -> list[dict]:
    return [_json_call(part) for part in split_top_level(text.strip(), ";")]


def _parse_json_array(text: str, _tools) -> list[dict]:
    """Nemotron Nano v2's region: a JSON array of {"name", "arguments"} objects."""
    value = strict_json.loads(text.strip())
    if not isinstance(value, list) or not value:
        raise ValueError("not an array of calls")
    return value


_DEEPSEEK_V31_CALL = re.compile(
    r"<｜tool▁call▁begin｜>\s*(?P<name>[^<\s]+?)\s*<｜tool▁sep｜>(?P<args>.*?)(?:<｜tool▁call▁end｜>|$)",
    re.DOTALL,
)
_DEEPSEEK_V3_CALL = re.compile(
    r"<｜tool▁call▁begin｜>\s*\w*\s*<｜tool▁sep｜>\s*(?P<name>[^\n<]+?)\s*\n```(?:json)?\s*\n"
    r"(?P<args>.*?)\n```\s*(?:<｜tool▁call▁end｜>|$)",
    re.DOTALL,
)


def _parse_deepseek(pattern: re.Pattern) -> Callable[[str, list], list[dict]]:
    def parse(text: str, _tools) -> list[dict]:
        calls = [
            {"name": m["name"], "arguments": strict_json.loads(m["args"].strip() or "{}")}
            for m in pattern.finditer(text)
        ]
        if not calls:
            raise ValueError("no DeepSeek call")
        return calls

    return parse


def split_top_level(text: str, sep: str) -> list[str]:
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


def _mlx_lm(name: str) -> Callable[[str, list], list[dict]]:
    def parse(text: str, tools: list[dict]) -> list[dict]:
        return mlx_lm_parser(name).parse_tool_call(text, tools)

    return parse


# ------------------------------------------------------------ grammars of one call


def _closed(parameters: dict) -> dict:
    """Arguments hold the declared properties only, unless the schema says otherwise (as
    OpenAI's strict mode): a small model given room invents keys until max_tokens."""
    if "properties" in parameters and "additionalProperties" not in parameters:
        return parameters | {"additionalProperties": False}
    return parameters


def _text_value(schema: dict) -> Piece:
    """A parameter written as bare text (the XML families): JSON for non-strings."""
    if schema.get("type") == "string":
        return ("lark", r"/[^<\n]*/")
    return ("json", schema)


def _xml_params(open_: Callable[[str], str], close: str, parameters: dict) -> list[Piece]:
    """Every declared parameter once, in order (a small model skips or repeats them else)."""
    pieces: list[Piece] = []
    for key, schema in (parameters.get("properties") or {}).items():
        pieces += [("text", open_(key)), _text_value(schema if isinstance(schema, dict) else {})]
        pieces.append(("text", close))
    return pieces


def _g_hermes(name: str, params: dict) -> list[Piece]:
    call = {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": _closed(params)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    return [("text", "<tool_call>\n"), ("json", call), ("text", "\n</tool_call>")]


def _g_qwen3_coder(name: str, params: dict) -> list[Piece]:
    body = _xml_params(lambda k: f"<parameter={k}>\n", "\n</parameter>\n", params)
    return [
        ("text", f"<tool_call>\n<function={name}>\n"),
        *body,
        ("text", "</function>\n</tool_call>"),
    ]


def _g_seed_oss(name: str, params: dict) -> list[Piece]:
    body = _xml_params(lambda k: f"<parameter={k}>", "</parameter>\n", params)
    return [
        ("text", f"<seed:tool_call>\n<function={name}>\n"),
        *body,
        ("text", "</function>\n</seed:tool_call>"),
    ]


def _g_nemotron(name: str, params: dict) -> list[Piece]:
    call = {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": _closed(params)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    return [("text", "<TOOLCALL>["), ("json", call), ("text", "]</TOOLCALL>")]


def _g_glm(name: str, params: dict) -> list[Piece]:
    body = _xml_params(lambda k: f"<arg_key>{k}</arg_key>\n<arg_value>", "</arg_value>\n", params)
    return [("text", f"<tool_call>{name}\n"), *body, ("text", "</tool_call>")]


def _g_minimax(name: str, params: dict) -> list[Piece]:
    body = _xml_params(lambda k: f'<parameter name="{k}">', "</parameter>\n", params)
    return [
        ("text", f'<minimax:tool_call>\n<invoke name="{name}">\n'),
        *body,
        ("text", "</invoke>\n</minimax:tool_call>"),
    ]


def _g_kimi(name: str, params: dict) -> list[Piece]:
    return [
        ("text", "<|tool_calls_section_begin|><|tool_call_begin|>"),
        ("text", f"functions.{name}:0<|tool_call_argument_begin|>"),
        ("json", _closed(params)),
        ("text", "<|tool_call_end|><|tool_calls_section_end|>"),
    ]


def _g_deepseek_v31(name: str, params: dict) -> list[Piece]:
    return [
        ("text", f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>"),
        ("json", _closed(params)),
        ("text", "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ]


def _g_deepseek_v3(name: str, params: dict) -> list[Piece]:
    head = f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n"
    return [
        ("text", head),
        ("json", _closed(params)),
        ("text", "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ]


def _g_mistral(name: str, params: dict) -> list[Piece]:
    return [("text", f"[TOOL_CALLS]{name}[ARGS]"), ("json", _closed(params))]


def _g_llama3(name: str, params: dict) -> list[Piece]:
    call = {
        "type": "object",
        "properties": {"name": {"const": name}, "parameters": _closed(params)},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }
    return [("json", call)]


def _g_pythonic(name: str, params: dict) -> list[Piece]:
    pieces: list[Piece] = [("text", f"<|tool_call_start|>[{name}(")]
    for i, (key, schema) in enumerate((params.get("properties") or {}).items()):
        pieces += [("text", (", " if i else "") + f"{key}="), ("json", schema)]
    return [*pieces, ("text", ")]<|tool_call_end|>")]


def _g_gemma4(name: str, params: dict) -> list[Piece]:
    pieces: list[Piece] = [("text", f"<|tool_call>call:{name}{{")]
    for i, (key, schema) in enumerate((params.get("properties") or {}).items()):
        pieces.append(("text", (", " if i else "") + f"{key}:"))
        if isinstance(schema, dict) and schema.get("type") == "string":
            pieces += [("text", '<|"|>'), ("lark", r'/[^<"]*/'), ("text", '<|"|>')]
        else:
            pieces.append(("json", schema))
    return [*pieces, ("text", "}<tool_call|>")]


# ------------------------------------------------------------ the formats

_WEATHER = '{"city": "Paris"}'
CALL_FORMATS: dict[str, CallFormat] = {
    f.name: f
    for f in [
        CallFormat(
            "hermes",
            "<tool_call>",
            "</tool_call>",
            _parse_hermes,
            "mlx-fleet",
            grammar=_g_hermes,
            example=f'<tool_call>\n{{"name": "get_weather", "arguments": {_WEATHER}}}\n</tool_call>',
        ),
        CallFormat(
            "llama3",
            "<|python_tag|>",
            "",
            _parse_llama3,
            "mlx-fleet",
            bare_start="{",
            grammar=_g_llama3,
            example=f'{{"name": "get_weather", "parameters": {_WEATHER}}}',
        ),
        CallFormat(
            "mistral",
            "[TOOL_CALLS]",
            "",
            _mlx_lm("mistral"),
            "mlx-lm",
            bare_start="[",
            grammar=_g_mistral,
            example=f"[TOOL_CALLS]get_weather[ARGS]{_WEATHER}",
        ),
        CallFormat(
            "qwen3_coder",
            "<tool_call>",
            "</tool_call>",
            _mlx_lm("qwen3_coder"),
            "mlx-lm",
            grammar=_g_qwen3_coder,
            example="<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
            "</parameter>\n</function>\n</tool_call>",
        ),
        CallFormat(
            "glm47",
            "<tool_call>",
            "</tool_call>",
            _mlx_lm("glm47"),
            "mlx-lm",
            grammar=_g_glm,
            example="<tool_call>get_weather\n<arg_key>city</arg_key>\n"
            "<arg_value>Paris</arg_value>\n</tool_call>",
        ),
        CallFormat(
            "kimi_k2",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            _mlx_lm("kimi_k2"),
            "mlx-lm",
            item_end="<|tool_call_end|>",
            grammar=_g_kimi,
            example="<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            f"<|tool_call_argument_begin|>{_WEATHER}<|tool_call_end|>"
            "<|tool_calls_section_end|>",
        ),
        CallFormat(
            "kimi_k3", "<|open|>tools<|sep|>", "<|close|>tools<|sep|>", _mlx_lm("kimi_k3"), "mlx-lm"
        ),
        CallFormat(
            "minimax_m2",
            "<minimax:tool_call>",
            "</minimax:tool_call>",
            _mlx_lm("minimax_m2"),
            "mlx-lm",
            item_end="</invoke>",
            grammar=_g_minimax,
            example='<minimax:tool_call>\n<invoke name="get_weather">\n'
            '<parameter name="city">Paris</parameter>\n</invoke>\n</minimax:tool_call>',
        ),
        CallFormat(
            "deepseek_v31",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            _parse_deepseek(_DEEPSEEK_V31_CALL),
            "mlx-fleet",
            item_end="<｜tool▁call▁end｜>",
            grammar=_g_deepseek_v31,
            example="<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
            f"{_WEATHER}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        CallFormat(
            "deepseek_v3",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            _parse_deepseek(_DEEPSEEK_V3_CALL),
            "mlx-fleet",
            item_end="<｜tool▁call▁end｜>",
            grammar=_g_deepseek_v3,
            example="<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
            f"get_weather\n```json\n{_WEATHER}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        CallFormat(
            "pythonic",
            "<|tool_call_start|>",
            "<|tool_call_end|>",
            _mlx_lm("pythonic"),
            "mlx-lm",
            grammar=_g_pythonic,
            example='<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>',
        ),
        CallFormat(
            "gemma4",
            "<|tool_call>",
            "<tool_call|>",
            _mlx_lm("gemma4"),
            "mlx-lm",
            grammar=_g_gemma4,
            example='<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
        ),
        CallFormat(
            "function_gemma",
            "<start_function_call>",
            "<end_function_call>",
            _mlx_lm("function_gemma"),
            "mlx-lm",
            example="<start_function_call>call:get_weather{city:<escape>Paris<escape>}"
            "<end_function_call>",
        ),
        CallFormat(
            "json_tools",
            "<tool_call>",
            "</tool_call>",
            _mlx_lm("json_tools"),
            "mlx-lm",
            grammar=_g_hermes,
        ),
        CallFormat(
            "longcat", "<longcat_tool_call>", "</longcat_tool_call>", _mlx_lm("longcat"), "mlx-lm"
        ),
        CallFormat(
            "laguna", "<tool_call>", "</tool_call>", _mlx_lm("laguna"), "mlx-lm", grammar=_g_glm
        ),
        CallFormat("minicpm5", "<function name=", "</function>", _mlx_lm("minicpm5"), "mlx-lm"),
        CallFormat(
            "muse_spark",
            "<atem:function_calls>",
            "</atem:function_calls>",
            _mlx_lm("muse_spark"),
            "mlx-lm",
            item_end="</atem:invoke>",
        ),
        CallFormat(
            "seed_oss",
            "<seed:tool_call>",
            "</seed:tool_call>",
            _mlx_lm("qwen3_coder"),
            "mlx-lm",
            grammar=_g_seed_oss,
            example="<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris"
            "</parameter>\n</function>\n</seed:tool_call>",
        ),
        CallFormat(
            "nemotron_json",
            "<TOOLCALL>",
            "</TOOLCALL>",
            _parse_json_array,
            "mlx-fleet",
            grammar=_g_nemotron,
            example=f'<TOOLCALL>[{{"name": "get_weather", "arguments": {_WEATHER}}}]</TOOLCALL>',
        ),
    ]
}
