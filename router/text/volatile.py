"""Per-request metadata that clients put in the prompt, taken out before templating.

Claude Code (2.1.29 and later) sends its first system block as
`x-anthropic-billing-header: cc_version=2.1.197.e12; cc_entrypoint=sdk-cli;`: the three hex
digits after the version come from the conversation's first user message, and toward some
hosts it adds `cch=<5 hex>;`, new on every request. The block sits at the head of the
prompt, so left in, a new conversation (or every turn) misses the whole cached system prompt
and tool list (measured: 25 of 21,105 prompt tokens read from cache). The model never needed
it. The patterns are the `[router] volatile_prompt_patterns` setting
(shared/config/router_section.py); its default (shared/config/choices.py) covers what real clients send today.

A pattern is a Python regular expression searched in the text of system and developer
messages (an Anthropic `system` array is joined first); every match is removed, and a system
message left empty is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from shared.config.choices import DEFAULT_VOLATILE_PATTERNS

_ROLES = ("system", "developer")


class Scrubbed(NamedTuple):
    messages: list[dict]
    removed: int  # matches taken out (0: the messages are the ones given)


class VolatileText:
    """The compiled patterns; `scrub` takes their matches out of system messages."""

    def __init__(self, patterns: Sequence[str] = DEFAULT_VOLATILE_PATTERNS):
        self.patterns = tuple(patterns)
        self._compiled = [re.compile(p) for p in self.patterns]

    def scrub(self, messages: list[dict]) -> Scrubbed:
        """Does not mutate `messages`: the messages with every match taken out of the text of
        system and developer turns, and how many matches there were."""
        if not self._compiled:
            return Scrubbed(messages, 0)
        out, removed = [], 0
        for message in messages:
            content = message.get("content")
            if message.get("role") not in _ROLES or not isinstance(content, str):
                out.append(message)
                continue
            text, count = self._strip(content)
            removed += count
            if count and not text.strip():
                continue  # the message held only metadata
            out.append(message | {"content": text} if count else message)
        return Scrubbed(out if removed else messages, removed)

    def _strip(self, text: str) -> tuple[str, int]:
        total = 0
        for pattern in self._compiled:
            text, count = pattern.subn("", text)
            total += count
        return text, total


NO_SCRUB = VolatileText(())
