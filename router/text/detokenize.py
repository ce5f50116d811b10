"""Token stream -> text, safe across multi-byte UTF-8 characters, with OpenAI stop strings."""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"
# How many tokens back the decode window starts: enough context for tokenizers whose
# decoding of a token depends on its neighbour (SentencePiece's leading space).
_CONTEXT_TOKENS = 4


class IncrementalDetokenizer:
    """Feed token ids, get the new text; never emits a partial character.

    Decodes a small window (a few context tokens + the tokens not yet emitted) and emits the
    part past the context once it does not end in U+FFFD, the mark of a character whose bytes
    have not all arrived. Cost per token is O(window), not O(sequence).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._tokens: list[int] = []
        self._prefix_offset = 0  # start of the context window
        self._read_offset = 0  # tokens before this are emitted

    def add(self, token_ids: Sequence[int]) -> str:
        """The text the new tokens complete (possibly empty)."""
        self._tokens.extend(token_ids)
        return self._emit(final=False)

    def flush(self) -> str:
        """Whatever is left at the end of the stream, incomplete characters included."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self._read_offset == len(self._tokens):
            return ""
        context = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        window = self._decode(self._tokens[self._prefix_offset :])
        if window.endswith(REPLACEMENT_CHAR) and not final:
            return ""
        self._read_offset = len(self._tokens)
        self._prefix_offset = max(self._prefix_offset, self._read_offset - _CONTEXT_TOKENS)
        return window[len(context) :]


def held_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`: text that
    may be the start of it, to hold back until the next piece says."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class StopMatcher:
    """Cuts text at the first OpenAI stop string, holding back text that may begin one."""

    def __init__(self, stops: Sequence[str], include: bool = False):
        self._stops = [s for s in stops if s]
        self._include = include  # vLLM's include_stop_str_in_output: the stop string is shown
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string found (Anthropic reports it)

    def feed(self, text: str) -> str:
        """Text safe to emit now; sets `stopped` when a stop string is found."""
        if self.stopped:
            return ""
        buffer = self._pending + text
        found = [(i, s) for s in self._stops if (i := buffer.find(s)) >= 0]
        if found:
            cut, self.matched = min(found)
            self.stopped = True
            self._pending = ""
            return buffer[: cut + len(self.matched)] if self._include else buffer[:cut]
        hold = max((held_suffix(buffer, stop) for stop in self._stops), default=0)
        self._pending = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold]

    def flush(self) -> str:
        """The held-back text, at the end of a stream that did not stop on a string."""
        rest, self._pending = self._pending, ""
        return "" if self.stopped else rest
