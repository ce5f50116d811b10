"""OpenAI request fields that are accepted without effect, and those refused outright.

No field is silently ignored (docs/api.md lists every one): a no-op field is still checked for
its type, and a field we cannot honour is a 400 naming it rather than an answer that quietly
differs from what was asked.
"""

from __future__ import annotations

from router.api.errors import bad_request

# field -> (JSON type it must have, why it changes nothing here)
ACCEPTED_NO_OPS = {
    "user": (str, "an end-user id for abuse tracking; not recorded"),
    "safety_identifier": (str, "as user"),
    "metadata": (dict, "stored completions are not kept"),
    "store": (bool, "stored completions are not kept"),
    "service_tier": (str, "one tier here"),
    "prompt_cache_key": (str, "prefix caching is automatic and cluster-wide"),
    "parallel_tool_calls": (bool, "the model may write several calls; all are returned"),
}

# field -> what to use instead
REFUSED = {
    "functions": "the deprecated 'functions' field is not supported; send 'tools'",
    "function_call": "the deprecated 'function_call' field is not supported; send 'tool_choice'",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "reasoning_effort": "reasoning effort is not adjustable; see chat_template_kwargs",
    "verbosity": "verbosity is not adjustable",
}
_TYPE_NAMES = {str: "a string", dict: "an object", bool: "a boolean"}


def check_chat_fields(body: dict) -> None:
    """400 for a refused field or a no-op field of the wrong type."""
    for name, message in REFUSED.items():
        if body.get(name) is not None and not _harmless(name, body[name]):
            raise bad_request(message, name)
    for name, (kind, _) in ACCEPTED_NO_OPS.items():
        value = body.get(name)
        if value is not None and type(value) is not kind:
            raise bad_request(f"'{name}' must be {_TYPE_NAMES[kind]}", name)


def _harmless(name: str, value) -> bool:
    """Values of refused fields that ask for nothing beyond what we do."""
    return name == "modalities" and value == ["text"]
