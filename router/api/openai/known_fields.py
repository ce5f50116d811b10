"""The request fields each endpoint knows; any other field is a 400 naming it.

OpenAI answers an unknown field with "Unrecognized request argument supplied"; so do we, on
every POST endpoint, so that a misspelt field (`max_token`) or another server's extension
(`guided_json`) is never silently without effect. Each set is the field column of the
endpoint's table in docs/api.md (honoured, refused with a reason, accepted no-op, or "see
sampling"); tests/unit/router/test_known_fields.py keeps the two, and the fields the router reads, equal.
"""

from __future__ import annotations

from router.api.errors import bad_request

_SAMPLING = {"temperature", "top_p", "top_k", "min_p", "seed", "n", "stop", "stream"}
_SEE_SAMPLING = {
    "logprobs", "top_logprobs", "logit_bias", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "response_format",
}  # fmt: skip

CHAT_FIELDS = frozenset(
    {"model", "messages", "max_completion_tokens", "max_tokens", "stream_options"}
    | _SAMPLING
    | _SEE_SAMPLING
    | {"tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"}
    | {"user", "safety_identifier", "metadata", "store", "service_tier", "prompt_cache_key"}
    | {"functions", "function_call", "audio", "modalities", "prediction", "web_search_options"}
    | {"reasoning_effort", "verbosity"}
)
COMPLETION_FIELDS = frozenset(
    {"model", "prompt", "max_tokens", "stream_options", "echo", "suffix", "best_of", "user"}
    | _SAMPLING
    | (_SEE_SAMPLING - {"top_logprobs"})  # legacy completions: `logprobs` is the count
)
MESSAGES_FIELDS = frozenset(
    {"model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p"}
    | {"top_k", "stream", "tools", "tool_choice", "chat_template_kwargs", "thinking", "metadata"}
)


def refuse_unknown_fields(body: dict, known: frozenset[str], endpoint: str) -> None:
    """400 naming the first field (in sorted order) that `endpoint` does not know."""
    unknown = sorted(body.keys() - known)
    if unknown:
        name = unknown[0]
        raise bad_request(
            f"unrecognized request argument supplied: {name!r} ({endpoint} does not know it; "
            "docs/api.md lists every field)",
            name,
        )


def check_messages_no_ops(body: dict) -> None:
    """/v1/messages' accepted no-op is still checked for its type."""
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_request("'metadata' must be an object", "metadata")
