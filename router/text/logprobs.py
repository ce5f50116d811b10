"""Per-token log-probabilities from the worker's deltas, rendered in OpenAI's shapes.

Chat: `choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [...]}],
"refusal": null}`. Completions (legacy): `choices[].logprobs = {tokens, token_logprobs,
top_logprobs: [{token: logprob}], text_offset}`. Each token is shown on its own: a token that
holds part of a UTF-8 character shows its bytes escaped (`\\xe2`), as OpenAI does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.text.tokenizer import ModelTokenizer
    from shared.protocol import TokenDelta


@dataclass(frozen=True)
class LogprobEntry:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # most likely first


def entries_of(delta: TokenDelta, skip: set[int]) -> list[LogprobEntry]:
    """The delta's tokens with their log-probabilities (none when it carries none)."""
    if delta.logprobs is None:
        return []
    tops = delta.top_logprobs or ()
    out = []
    for i, (token, logprob) in enumerate(zip(delta.token_ids, delta.logprobs, strict=False)):
        if token in skip:
            continue
        top = tops[i] if i < len(tops) else None
        pairs = tuple(zip(top.token_ids, top.logprobs, strict=True)) if top else ()
        out.append(LogprobEntry(token, logprob, pairs))
    return out


class LogprobsRenderer:
    """Renders one choice's entries, chunk by chunk (completions count text offsets)."""

    def __init__(self, tokenizer: ModelTokenizer, kind: str, top_logprobs: int):
        self.tokenizer, self.kind, self.top_logprobs = tokenizer, kind, top_logprobs
        self._offset = 0  # characters of completion text before the next token

    def render(self, entries: list[LogprobEntry]) -> dict:
        return self._chat(entries) if self.kind == "chat" else self._legacy(entries)

    def _token(self, token_id: int) -> tuple[str, bytes]:
        raw = self.tokenizer.token_bytes(token_id)
        return raw.decode("utf-8", errors="backslashreplace"), raw

    def _chat(self, entries: list[LogprobEntry]) -> dict:
        content = []
        for e in entries:
            text, raw = self._token(e.token_id)
            top = []
            for token_id, logprob in e.top[: self.top_logprobs]:
                t, b = self._token(token_id)
                top.append({"token": t, "logprob": logprob, "bytes": list(b)})
            content.append(
                {"token": text, "logprob": e.logprob, "bytes": list(raw), "top_logprobs": top}
            )
        return {"content": content, "refusal": None}

    def _legacy(self, entries: list[LogprobEntry]) -> dict:
        tokens, offsets, tops = [], [], []
        for e in entries:
            text, _ = self._token(e.token_id)
            tokens.append(text)
            offsets.append(self._offset)
            self._offset += len(text)
            top = {}
            for token_id, logprob in e.top[: self.top_logprobs]:
                top.setdefault(self._token(token_id)[0], logprob)
            tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": tops if self.top_logprobs else None,
            "text_offset": offsets,
        }
