"""vLLM's sampling extensions on chat and completions, as serving benchmarks send them
(guidellm, `vllm bench serve`, genai-perf force exact output lengths with `ignore_eos`):
`ignore_eos`, `min_tokens`, `stop_token_ids`, `include_stop_str_in_output`,
`skip_special_tokens` (`spaces_between_special_tokens` is checked in fields.py: true only).
"""

from __future__ import annotations

from dataclasses import dataclass

from router.api.checks import typed_field
from router.errors import bad_request

MAX_STOP_TOKEN_IDS = 64


@dataclass(frozen=True)
class Extensions:
    stop_token_ids: tuple[int, ...]  # the model's end tokens (unless ignore_eos) + the body's
    min_tokens: int
    include_stop_str: bool
    skip_special_tokens: bool


def extensions(body: dict, end_token_ids, vocab_size: int, max_tokens: int) -> Extensions:
    """The extensions of `body`; `end_token_ids` are the model's EOS / end-of-turn tokens."""
    ignore_eos = typed_field(body, "ignore_eos", bool, False)
    extra = _stop_token_ids(body, vocab_size)
    ends = () if ignore_eos else tuple(end_token_ids)
    min_tokens = typed_field(body, "min_tokens", int, 0)
    if not 0 <= min_tokens <= max_tokens:
        raise bad_request(
            f"'min_tokens' must be between 0 and max_tokens ({max_tokens}), got {min_tokens}",
            "min_tokens",
        )
    return Extensions(
        tuple(dict.fromkeys(ends + extra)),
        min_tokens,
        typed_field(body, "include_stop_str_in_output", bool, False),
        typed_field(body, "skip_special_tokens", bool, True),
    )


def _stop_token_ids(body: dict, vocab_size: int) -> tuple[int, ...]:
    value = body.get("stop_token_ids")
    if value is None:
        return ()
    if not (isinstance(value, list) and all(type(t) is int for t in value)):
        raise bad_request("'stop_token_ids' must be an array of token ids", "stop_token_ids")
    if len(value) > MAX_STOP_TOKEN_IDS:
        raise bad_request(
            f"'stop_token_ids' may hold at most {MAX_STOP_TOKEN_IDS} ids", "stop_token_ids"
        )
    if not all(0 <= t < vocab_size for t in value):
        raise bad_request(
            f"'stop_token_ids' holds an id outside the vocabulary [0, {vocab_size})",
            "stop_token_ids",
        )
    return tuple(value)
