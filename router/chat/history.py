"""A conversation's earlier turns in the form the model's own template expects.

- Earlier reasoning (`reasoning_content` on an assistant message, vLLM's field; `reasoning` is
  taken too) goes to the template under both names templates read: `reasoning_content` (Qwen 3,
  GLM, Kimi, MiniMax, DeepSeek) and `thinking` (gpt-oss). Each template decides what it keeps
  (most drop the reasoning of turns before the last user message).
- A tool result names its function (`name`) when the client left it out: harmony's template and
  others write the function's name on the result, found from the call it answers.
- Earlier calls' arguments go as a dict (Hugging Face's convention) unless the template prints
  them as they are: then as JSON text (a dict printed by Jinja is Python's repr, not JSON).
  Which one is probed once per template (`probe_arguments`).
- DeepSeek V3.1's template renders calls and results but not the tools: its tool prompt is the
  one its model card documents, in the system message.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.chat.dialects import Dialect
    from router.chat.tools import ToolSet
    from router.text.tokenizer import ModelTokenizer

_PROBE_KEY = "mlx_fleet_probe_key"


def history_for(dialect: Dialect, messages: list[dict]) -> list[dict]:
    names = {}
    out = []
    for message in messages:
        message = dict(message)
        for call in message.get("tool_calls") or ():
            if "id" in call:
                names[call["id"]] = call["function"]["name"]
        if message["role"] == "assistant" and "reasoning_content" in message:
            message["thinking"] = message["reasoning_content"]
        name = names.get(message.get("tool_call_id")) if message["role"] == "tool" else None
        if name is not None and "name" not in message:
            message["name"] = name
        if dialect.arguments_as_json and message.get("tool_calls"):
            message["tool_calls"] = [_json_arguments(c) for c in message["tool_calls"]]
        out.append(message)
    return out


def _json_arguments(call: dict) -> dict:
    fn = call["function"]
    arguments = fn["arguments"]
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return call | {"function": fn | {"arguments": arguments}}


def probe_arguments(dialect: Dialect, tokenizer: ModelTokenizer) -> Dialect:
    """`dialect` with `arguments_as_json` set when the template prints arguments as given."""

    def render(arguments) -> str | None:
        call = {
            "id": "a1b2c3d4e",
            "type": "function",  # 9 characters: Mistral's rule
            "function": {"name": "probe", "arguments": arguments},
        }
        turns = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "probe", "content": "1"},
            {"role": "assistant", "content": "ok"},  # Mistral's: an answer after results
            {"role": "user", "content": "hi"},
        ]
        try:
            return tokenizer.render_chat(turns, add_generation_prompt=True)
        except Exception:  # a template's raise_exception, or a dict joined to a string
            return None

    as_dict = render({_PROBE_KEY: 1})
    if as_dict is None:  # DeepSeek's templates join the arguments to strings: JSON text
        return replace(dialect, arguments_as_json=render(f'{{"{_PROBE_KEY}": 1}}') is not None)
    return replace(dialect, arguments_as_json=f"{{'{_PROBE_KEY}'" in as_dict)


def family_tool_prompt(kind: str, messages: list[dict], tools: ToolSet) -> list[dict]:
    """The conversation with the family's own tool prompt in its system message."""
    prompt = _deepseek_prompt(tools, kind)
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [first | {"content": first["content"] + "\n\n" + prompt}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


_DEEPSEEK_CALL = {
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>"
    "tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>tool_call_name\n"
    "```json\ntool_call_arguments\n```<｜tool▁call▁end｜>{{additional_tool_calls}}"
    "<｜tool▁calls▁end｜>",
}


def _deepseek_prompt(tools: ToolSet, kind: str) -> str:
    parts = ["## Tools\nYou have access to the following tools:\n"]
    for tool in tools.functions:
        fn = tool["function"]
        parts.append(
            f"### {fn['name']}\nDescription: {fn.get('description', '')}\n\n"
            f"Parameters: {json.dumps(fn['parameters'], ensure_ascii=False)}\n"
        )
    must = {
        "auto": "",
        "required": "You must call at least one of these tools.\n\n",
    }.get(tools.choice, f"You must call the tool {tools.choice}.\n\n")
    parts.append(
        f"{must}IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
        f"{_DEEPSEEK_CALL[kind]}\n\n"
        "Where:\n- `tool_call_name` must be an exact match to one of the available tools\n"
        "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters "
        "Schema\n- For multiple tool calls, chain them directly without separators or spaces"
    )
    return "\n".join(parts)
