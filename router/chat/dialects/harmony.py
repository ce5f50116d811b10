"""gpt-oss's harmony format, read from the reply's text with its special tokens kept.

A reply is a run of messages, each `<|start|>assistant` (left out for the first, which the
prompt opened) `<|channel|>CHANNEL [to=RECIPIENT] [<|constrain|>json]<|message|>BODY` ending in
`<|end|>` (one message of the turn), or in `<|call|>` / `<|return|>` (the turn's last; both are
stop tokens, so the router sees the text end). Channels: `analysis` is reasoning, `final` the
answer, `commentary` a preamble the user may see, or a tool call when it has a recipient
`functions.NAME` (its body is the arguments' JSON).

`openai-harmony` renders and parses this on token ids, but needs the o200k vocabulary file,
fetched from the network on first use; the router reads the text it already decodes instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from router.chat.dialects.calls import ParsedCall
from router.text import strict_json
from router.text.detokenize import held_suffix

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


@dataclass
class _Message:
    channel: str
    recipient: str | None
    body: str = ""


class HarmonyReader:
    """Feed reply text; get ("reasoning" | "content", text) and ("call", ParsedCall) parts."""

    def __init__(self, declared: frozenset[str] | None):
        self._declared = declared  # the request's function names (None: no tools)
        self._held = ""
        self._header: str | None = ""  # text of the header being read; None inside a body
        self._message: _Message | None = None

    def feed(self, text: str) -> list[tuple[str, object]]:
        buffer, self._held = self._held + text, ""
        out: list[tuple[str, object]] = []
        while buffer:
            if self._message is None:
                header = (self._header or "") + buffer
                i = header.find(MESSAGE)
                if i < 0:
                    self._header = header
                    return out
                self._open(header[:i])
                buffer = header[i + len(MESSAGE) :]
                continue
            i = buffer.find(END)
            if i < 0:
                hold = held_suffix(buffer, END)
                out += self._body(buffer[: len(buffer) - hold])
                self._held = buffer[len(buffer) - hold :]
                return out
            out += self._body(buffer[:i]) + self._close()
            buffer = buffer[i + len(END) :]
        return out

    def finish(self) -> list[tuple[str, object]]:
        """The reply ended (at <|call|>, <|return|>, a stop or the length limit)."""
        held, self._held = self._held, ""
        if self._message is None:
            header, self._header = self._header or "", ""
            text = header.replace(START, "").strip()
            return [("content", text)] if text and CHANNEL not in header else []
        return self._body(held) + self._close()

    def _open(self, header: str) -> None:
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        self._message = _Message(
            channel.group(1) if channel else "final", recipient.group(1) if recipient else None
        )
        self._header = None

    def _body(self, text: str) -> list[tuple[str, object]]:
        message = self._message
        assert message is not None
        if self._is_call(message):
            message.body += text
            return []
        kind = "reasoning" if message.channel == "analysis" else "content"
        return [(kind, text)] if text else []

    def _close(self) -> list[tuple[str, object]]:
        message, self._message, self._header = self._message, None, ""
        if message is None or not self._is_call(message):
            return []
        assert message.recipient is not None
        name = message.recipient.removeprefix("functions.")
        try:
            arguments = strict_json.loads(message.body.strip() or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict) or self._declared is None or name not in self._declared:
            return [("content", message.body)]  # not a call we can hand back: the model's text
        return [("call", ParsedCall(name, json.dumps(arguments, ensure_ascii=False)))]

    def _is_call(self, message: _Message) -> bool:
        return message.recipient is not None and self._declared is not None
