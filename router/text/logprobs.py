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
    logprob: float | None  # None: the prompt's first token (nothing before it)
    top: tuple[tuple[int, float], ...]  # most likely first
    prompt: bool = False  # a prompt token's (echo, prompt_logprobs), not a generated one's
    rank: int | None = None  # prompt tokens: 1 = the most likely


def prompt_entries_of(delta: TokenDelta, prompt_ids: tuple[int, ...]) -> list[LogprobEntry]:
    """The prompt's entries a (first) delta carries: its first token's (logprob None), then
    each later token's given the ones before it; none when it carries none."""
    if delta.prompt_logprobs is None or not prompt_ids:
        return []
    tops = delta.prompt_top_logprobs or ()
    ranks = delta.prompt_ranks or ()
    out = [LogprobEntry(prompt_ids[0], None, (), prompt=True)]
    for i, (token, logprob) in enumerate(zip(prompt_ids[1:], delta.prompt_logprobs, strict=False)):
        top = tuple(zip(tops[i].token_ids, tops[i].logprobs, strict=True)) if i < len(tops) else ()
        rank = ranks[i] if i < len(ranks) else None
        out.append(LogprobEntry(token, logprob, top, prompt=True, rank=rank))
    return out


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
            tops.append(top if e.logprob is not None else None)
        rendered = {"tokens": tokens, "token_logprobs": [e.logprob for e in entries]}
        if self.top_logprobs:  # k = 0 asks for none: left out (OpenAI's schema has no null)
            rendered["top_logprobs"] = tops
        return rendered | {"text_offset": offsets}


def vllm_prompt_logprobs(
    entries: list[LogprobEntry], k: int, tokenizer: ModelTokenizer
) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: None for the first token, then per prompt token a map of
    token id -> {logprob, rank, decoded_token}: the token itself and the `k` most likely."""
    out: list[dict | None] = []
    for e in entries:
        if e.logprob is None:
            out.append(None)
            continue
        ranked = {e.token_id: (e.logprob, e.rank)}
        for r, (token_id, logprob) in enumerate(e.top[:k], start=1):
            ranked.setdefault(token_id, (logprob, r))
        out.append(
            {
                str(t): {"logprob": lp, "rank": rank, "decoded_token": tokenizer.decode([t])}
                for t, (lp, rank) in ranked.items()
            }
        )
    return out
