"""OpenAI `tools` / `tool_choice` checked at the edge, and the chat history that carries calls.

Templates that know about tools get them via `apply_chat_template(tools=...)`. For a template
that does not (it never mentions `tools`), the documented fallback (docs/api.md) is a system
prompt in the Hermes format: the functions' JSON schemas inside `<tools></tools>` and the
instruction to answer with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; earlier
calls are rendered the same way in the assistant's text and tool results as user turns inside
`<tool_response></tool_response>`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from router.chat.images.parts import image_mark, is_image_part
from router.errors import bad_request
from router.text import strict_json

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(frozen=True)
class ToolSet:
    functions: tuple[
        dict, ...
    ]  # each {"type": "function", "function": {name, description?, parameters}}
    choice: str  # "auto" | "required" | a function name ("none" means no ToolSet at all)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f["function"]["name"] for f in self.functions)


def parse_tools(body: dict) -> ToolSet | None:
    """The request's tools, or None when there are none or `tool_choice` is "none"."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array of function tools", "tools")
    functions = tuple(_function_tool(t, i) for i, t in enumerate(tools))
    names = [f["function"]["name"] for f in functions]
    if len(set(names)) != len(names):
        raise bad_request("'tools' holds two functions of the same name", "tools")
    choice = _tool_choice(choice, names)
    return None if choice == "none" else ToolSet(functions, choice)


def _function_tool(tool, i: int) -> dict:
    param = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise bad_request(f"{param} must be an object with type 'function'", param)
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f"{param}.function must be an object", f"{param}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad_request(
            f"{param}.function.name must be 1-64 letters, digits, '_', '.' or '-'",
            f"{param}.function.name",
        )
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"{param}.function.description must be a string", param)
    parameters = fn.get("parameters")
    if parameters is None:  # left out (or null): a function that takes no arguments
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise bad_request(f"{param}.function.parameters must be a JSON schema object", param)
    clean = {"name": name}  # OpenAI's order: templates print it as it is
    if description:
        clean["description"] = description
    clean["parameters"] = parameters
    return {"type": "function", "function": clean}


def _tool_choice(choice, names: list[str]) -> str:
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if name in names:
            return name
        raise bad_request(f"'tool_choice' names a function not in 'tools': {name!r}", "tool_choice")
    raise bad_request(
        "'tool_choice' must be 'auto', 'none', 'required' or "
        '{"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )


# ------------------------------------------------------------ messages


def chat_messages(body: dict) -> list[dict]:
    """OpenAI messages checked and normalised for a chat template."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    return [_message(m, i) for i, m in enumerate(messages)]


def _message(message, i: int) -> dict:
    param = f"messages[{i}]"
    if not isinstance(message, dict):
        raise bad_request(f"{param} must be an object", param)
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise bad_request(f"{param}.role must be one of {', '.join(CHAT_ROLES)}", f"{param}.role")
    calls = message.get("tool_calls")
    content = message.get("content")
    if role == "assistant" and calls is not None:
        text = "" if content is None else content_text(content, f"{param}.content")
        out = {"role": role, "content": text, "tool_calls": _history_calls(calls, param)}
        return out | _name(message, param) | _reasoning(message, param)
    text = content_text(content, f"{param}.content", images=role == "user")
    out = {"role": role, "content": text} | _name(message, param)
    if role == "assistant":
        out |= _reasoning(message, param)
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise bad_request(f"{param}.tool_call_id must be a string", f"{param}.tool_call_id")
        out["tool_call_id"] = call_id
    return out


def _reasoning(message: dict, param: str) -> dict:
    """An earlier reply's reasoning (vLLM's `reasoning_content`, or `reasoning`), for templates
    that show it (router/chat/history.py)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise bad_request(f"{param}.{key} must be a string", f"{param}.{key}")
        return {"reasoning_content": value}
    return {}


def _name(message: dict, param: str) -> dict:
    """The participant's `name`, for templates that show it (most ignore it)."""
    name = message.get("name")
    if name is None:
        return {}
    if not isinstance(name, str):
        raise bad_request(f"{param}.name must be a string", f"{param}.name")
    return {"name": name}


def content_text(content, param: str, images: bool = False) -> str:
    """The text of a message's content; an image part becomes its mark
    (router/chat/images/parts.py) where `images` are allowed (user messages)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if is_image_part(part):
                parts.append(image_mark(part, f"{param}[{j}]", images))
                continue
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                raise bad_request(f"{param}: only text and image parts are supported", param)
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"{param} must be a string or an array of text parts", param)


def _history_calls(calls, param: str) -> list[dict]:
    param = f"{param}.tool_calls"
    if not isinstance(calls, list):
        raise bad_request(f"{param} must be an array", param)
    return [_history_call(c, f"{param}[{j}]") for j, c in enumerate(calls)]


def _history_call(call, param: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(
            f"{param} must be {{'type': 'function', 'function': {{name, ...}}}}", param
        )
    arguments = fn.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = strict_json.loads(arguments)
        except strict_json.StrictJsonError as e:
            raise bad_request(f"{param}.function.arguments {e}", param) from None
    if not isinstance(arguments, dict):
        raise bad_request(f"{param}.function.arguments must be a JSON object", param)
    call_id = call.get("id")
    out = {"type": "function", "function": {"name": fn["name"], "arguments": arguments}}
    return out | ({"id": call_id} if isinstance(call_id, str) else {})


# ------------------------------------------------------------ fallback format


def fallback_messages(messages: list[dict], tools: ToolSet | None) -> list[dict]:
    """The conversation in the Hermes text format, for a template with no tool support."""
    out = [_hermes_turn(m) for m in messages]
    if tools is None:
        return out
    prompt = _hermes_system_prompt(tools)
    if out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + prompt}, *out[1:]]
    return [{"role": "system", "content": prompt}, *out]


def _hermes_turn(message: dict) -> dict:
    if message["role"] == "tool":
        return {
            "role": "user",
            "content": f"<tool_response>\n{message['content']}\n</tool_response>",
        }
    if "tool_calls" in message:
        calls = [
            "<tool_call>\n"
            + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
            + "\n</tool_call>"
            for c in message["tool_calls"]
        ]
        text = "\n".join(filter(None, [message["content"], *calls]))
        return {"role": "assistant", "content": text}
    return message


def _hermes_system_prompt(tools: ToolSet) -> str:
    schemas = "\n".join(json.dumps(f) for f in tools.functions)
    must = {
        "auto": "You may call one or more functions to assist with the user query.",
        "required": "You must call at least one of these functions.",
    }.get(tools.choice, f"You must call the function {tools.choice}.")
    return (
        f"# Tools\n\n{must}\n\nYou are provided with function signatures within "
        f"<tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\nFor each function call, "
        "return a json object with function name and arguments within <tool_call></tool_call> "
        'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )
