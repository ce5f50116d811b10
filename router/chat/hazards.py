"""Cache hazards of a chat template, found once at load (router/lifecycle.py logs them).

A template that writes the date or time before the conversation (gpt-oss's `Current date:`,
Llama 3.1's `Today Date:` when the clock is given to it) changes the head of every prompt
when the clock moves on: every prefix cached the day before misses, system prompt and tools
included. Nothing here changes the prompt (the model may need the date); the operator is told,
and can override the template (`--chat-template`).

The template is rendered twice around one user message, with the clock its `strftime_now`
reads set to two different moments; where the two texts first differ, if before the message,
is the hazard.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.text.tokenizer import ModelTokenizer

_PROBE = "mlx-fleet cache hazard probe"
# two moments that differ in every field a template could print (year, month, day, weekday,
# hour, minute, second)
_MOMENTS = (_dt.datetime(2024, 1, 2, 3, 4, 5), _dt.datetime(2025, 11, 29, 22, 58, 59))


def clock_hazard(tokenizer: ModelTokenizer) -> str | None:
    """A sentence naming what the template writes from the clock before the conversation, or
    None (no clock read, or read only after the first user message)."""
    if "strftime_now" not in tokenizer.template_source:
        return None  # HF templates read the clock only through strftime_now
    texts = []
    for moment in _MOMENTS:
        with _clock_at(moment):
            try:
                texts.append(tokenizer.render_chat([{"role": "user", "content": _PROBE}]))
            except Exception:  # a template that needs more than one user message to render
                return None
    first, second = texts
    at = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), None)
    probe = first.find(_PROBE)
    if at is None or probe < 0 or at > probe:
        return None
    line_start = first.rfind("\n", 0, at) + 1
    line_end = first.find("\n", at)
    excerpt = first[line_start : line_end if line_end >= 0 else at + 40].strip()
    return (
        f"the chat template writes the clock before the conversation ({excerpt!r}): every "
        "cached prefix misses once it changes (override the template with --chat-template "
        "to keep the date out)"
    )


@contextlib.contextmanager
def _clock_at(moment: _dt.datetime) -> Iterator[None]:
    """transformers' `strftime_now` reads `datetime.now()` of its own module when called:
    point that at a fixed moment for the render."""
    from transformers.utils import chat_template_utils as module

    class Fixed(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return moment

    saved = module.datetime
    module.datetime = Fixed
    try:
        yield
    finally:
        module.datetime = saved
