"""A batch's input file: its bounds at upload, its lines checked when the batch starts (a
malformed file fails the whole batch with OpenAI's error lines, as `errors.data`), the order
its lines run in, and the lines of its output and error files.

Only the file's shape is checked here (JSON lines with `custom_id`, `method`, `url`, `body`);
a line whose body its endpoint refuses is answered with that endpoint's error, alone.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from router.api.batch.objects import new_id
from router.errors import ApiError, bad_request

MAX_ERRORS = 100  # error lines kept in a failed batch's `errors` (the first ones)
FIELDS = ("custom_id", "method", "url", "body")


class Line(NamedTuple):
    index: int  # 0-based position in the input file
    custom_id: str
    body: dict


def check_upload(data: bytes, purpose: str, max_bytes: int, max_lines: int) -> None:
    """An upload within the bounds: 413 over `max_bytes`; 400 when empty, not UTF-8, or over
    `max_lines` lines (a batch's file is JSONL: one request per line)."""
    if len(data) > max_bytes:
        raise ApiError(
            413,
            f"the file is {len(data)} bytes; at most {max_bytes} are accepted",
            "file",
            "file_too_large",
        )
    if not data.strip():
        raise bad_request("the file is empty", "file", "empty_file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request("the file is not UTF-8 text", "file", "invalid_file_format") from None
    lines = sum(1 for line in text.splitlines() if line.strip())
    if purpose == "batch" and lines > max_lines:
        raise bad_request(
            f"the file has {lines} lines; a batch file may hold at most {max_lines}",
            "file",
            "too_many_lines",
        )


def parse_input(data: bytes, endpoint: str) -> tuple[list[Line], list[dict]]:
    """The file's requests, or (when any line is malformed) OpenAI's error lines: each with a
    `code`, `message`, `param` and 1-based `line`."""
    lines: list[Line] = []
    errors: list[dict] = []
    seen: set[str] = set()
    for number, raw in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        line, error = _line(raw, number, endpoint, seen)
        if error is not None:
            errors.append(error)
        elif line is not None:
            lines.append(line._replace(index=len(lines)))
    if not lines and not errors:
        errors.append(_error("empty_file", "the input file holds no requests", None, None))
    return lines, errors[:MAX_ERRORS]


def _line(raw: str, number: int, endpoint: str, seen: set[str]):
    try:
        item = json.loads(raw)
    except ValueError:
        return None, _error("invalid_json_line", "this line is not valid JSON", None, number)
    if not isinstance(item, dict):
        return None, _error("invalid_json_line", "this line is not a JSON object", None, number)
    for name in FIELDS:
        if name not in item:
            message = f"'{name}' is required"
            return None, _error("missing_required_parameter", message, name, number)
    custom_id, body = item["custom_id"], item["body"]
    if not isinstance(custom_id, str) or not custom_id:
        message = "'custom_id' must be a non-empty string"
        return None, _error("invalid_request", message, "custom_id", number)
    if custom_id in seen:
        message = f"the custom_id '{custom_id}' is used by an earlier line; each must be unique"
        return None, _error("duplicate_custom_id", message, "custom_id", number)
    seen.add(custom_id)
    if item["method"] != "POST":
        return None, _error("invalid_method", "'method' must be 'POST'", "method", number)
    if item["url"] != endpoint:
        message = f"'url' is {item['url']!r}, but this batch's endpoint is {endpoint!r}"
        return None, _error("invalid_url", message, "url", number)
    if not isinstance(body, dict):
        return None, _error("invalid_request", "'body' must be an object", "body", number)
    return Line(0, custom_id, body), None


def _error(code: str, message: str, param: str | None, line: int | None) -> dict:
    return {"code": code, "message": message, "param": param, "line": line}


def prefix_order(lines: list[Line]) -> list[Line]:
    """The lines in the order they run: sorted by model, then prompt text, so lines sharing a
    prefix (a system prompt, a few-shot preamble) run next to each other and hit the cache
    their first one filled."""
    return sorted(lines, key=lambda line: (str(line.body.get("model")), _prompt_key(line.body)))


def _prompt_key(body: dict) -> str:
    for name in ("messages", "prompt", "input"):
        if name in body:
            return json.dumps([body.get("instructions"), body[name]], ensure_ascii=False)
    return ""


def answered(custom_id: str, status: int, body: dict) -> dict:
    """A line's output (status 200) or error-file (any other status) entry."""
    request_id = body.get("id") if isinstance(body.get("id"), str) else new_id("req_")
    response = {"status_code": status, "request_id": request_id, "body": body}
    return {"id": new_id("batch_req_"), "custom_id": custom_id, "response": response, "error": None}


def unanswered(custom_id: str, code: str) -> dict:
    """The error-file entry of a line the batch never ran (it expired or was cancelled)."""
    why = "expired" if code == "batch_expired" else "was cancelled"
    message = f"this request was not executed: the batch {why} before it ran"
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def jsonl(entries: list[dict]) -> bytes:
    return "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries).encode()
