"""Responses `input` -> items (checked, with ids, as stored and listed) -> chat messages.

The messages are router/chat/tools.py's normalised ones, so /v1/responses renders through the
same chat template, tool format and fallback as /v1/chat/completions: `function_call` items
become the assistant's `tool_calls`, `function_call_output` items `tool` messages, and a
`reasoning` item the next assistant message's `reasoning_content` (templates that know it,
such as Qwen3's, show it; others drop it, as they drop earlier turns' reasoning).
"""

from __future__ import annotations

import uuid

from router.chat.images.parts import image_mark, is_image_part
from router.errors import bad_request
from router.text import strict_json

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")
_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def new_item_id(kind: str) -> str:
    return f"{_PREFIXES.get(kind, 'rs')}_{uuid.uuid4().hex}"


def input_items(value) -> list[dict]:
    """`input` as a list of checked items, each with an `id`."""
    if isinstance(value, str):
        return [_message({"role": "user", "content": value}, "input")]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty array of items", "input")
    return [_item(item, f"input[{i}]") for i, item in enumerate(value)]


def _item(item, param: str) -> dict:
    if not isinstance(item, dict):
        raise bad_request(f"{param} must be an object", param)
    kind = item.get("type", "message")
    if kind == "message":
        return _message(item, param)
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        if not (isinstance(name, str) and isinstance(arguments, str)):
            raise bad_request(f"{param}: a function_call needs a name and arguments", param)
        _arguments_object(arguments, param)
        out = {"type": kind, "call_id": _call_id(item, param), "name": name}
        return _with_id(item, kind) | out | {"arguments": arguments, "status": "completed"}
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _parts_text(output, f"{param}.output")
        out = {"type": kind, "call_id": _call_id(item, param), "output": text}
        return _with_id(item, kind) | out | {"status": "completed"}
    if kind == "reasoning":
        return _reasoning(item, param)
    raise bad_request(
        f"{param}.type {kind!r} is not supported: input items may be message, function_call, "
        "function_call_output or reasoning",
        f"{param}.type",
    )


def _message(item: dict, param: str) -> dict:
    role = item.get("role")
    if role not in ROLES:
        raise bad_request(f"{param}.role must be one of {', '.join(ROLES)}", f"{param}.role")
    content = item.get("content")
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        part = {"type": kind, "text": content}
        parts = [part | {"annotations": []} if kind == "output_text" else part]
    else:
        _parts_text(content, f"{param}.content", images=role == "user")
        parts = content
    out = {"type": "message", "role": role, "content": parts, "status": "completed"}
    return _with_id(item, "message") | out


def _parts_text(parts, param: str, images: bool = False) -> str:
    """The parts' text; an image part (`images`: allowed here, in user messages) becomes its
    mark (router/chat/images/parts.py)."""
    if not isinstance(parts, list):
        raise bad_request(f"{param} must be a string or an array of text parts", param)
    texts = []
    for j, part in enumerate(parts):
        if is_image_part(part):
            texts.append(image_mark(part, f"{param}[{j}]", images))
            continue
        if not (
            isinstance(part, dict)
            and part.get("type") in TEXT_PARTS
            and isinstance(part.get("text"), str)
        ):
            raise bad_request(
                f"{param}[{j}]: only input_text / output_text / input_image parts are supported",
                param,
            )
        texts.append(part["text"])
    return "".join(texts)


def _reasoning(item: dict, param: str) -> dict:
    for key in ("content", "summary"):
        parts = item.get(key) or []
        if not (isinstance(parts, list) and all(isinstance(p, dict) for p in parts)):
            raise bad_request(f"{param}.{key} must be an array of text parts", f"{param}.{key}")
    out = {"type": "reasoning", "summary": item.get("summary") or []}
    return _with_id(item, "reasoning") | out | {"content": item.get("content") or []}


def _with_id(item: dict, kind: str) -> dict:
    item_id = item.get("id")
    return {"id": item_id if isinstance(item_id, str) and item_id else new_item_id(kind)}


def _call_id(item: dict, param: str) -> str:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"{param}.call_id must be a non-empty string", f"{param}.call_id")
    return call_id


def _arguments_object(arguments: str, param: str) -> dict:
    try:
        value = strict_json.loads(arguments)
    except strict_json.StrictJsonError as e:
        raise bad_request(f"{param}.arguments {e}", f"{param}.arguments") from None
    if not isinstance(value, dict):
        raise bad_request(f"{param}.arguments must be a JSON object", f"{param}.arguments")
    return value


# ------------------------------------------------------------ chat messages


def chat_messages(items: list[dict]) -> list[dict]:
    """The normalised chat messages of checked items (ours, or earlier replies' output)."""
    messages: list[dict] = []
    reasoning = ""
    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            reasoning += _reasoning_text(item)
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
        elif kind == "message" and item["role"] != "assistant":
            text = _parts_text(item["content"], "input", images=item["role"] == "user")
            messages.append({"role": item["role"], "content": text})
        else:
            last = messages[-1] if messages else None
            if kind == "message" or last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            if kind == "message":
                last["content"] += _parts_text(item["content"], "")
            else:
                function = {
                    "name": item["name"],
                    "arguments": _arguments_object(item["arguments"], "input"),
                }
                call = {"id": item["call_id"], "type": "function", "function": function}
                last.setdefault("tool_calls", []).append(call)
            if reasoning:
                last["reasoning_content"], reasoning = reasoning, ""
    if not messages:
        raise bad_request("'input' holds no message to answer", "input")
    return messages


def _reasoning_text(item: dict) -> str:
    parts = item.get("content") or item.get("summary") or []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))
