"""Bodies that count or convert tokens without generating: vLLM's `POST /tokenize` and
`POST /detokenize`, Anthropic's `POST /v1/messages/count_tokens`. Each parse checks the body
(400s naming the field, like the generation endpoints) and returns the response JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.api.anthropic.parse import MESSAGES_FIELDS, messages_prompt
from router.api.checks import refuse_unknown_fields, typed_field
from router.chat.images.placement import NO_IMAGES, PromptImages
from router.chat.prompt import build_chat_prompt, template_kwargs
from router.chat.tools import chat_messages, parse_tools
from router.errors import bad_request

if TYPE_CHECKING:
    from router.text.tokenizer import ModelTokenizer

_COMMON = frozenset({"model", "add_special_tokens", "return_token_strs"})
TOKENIZE_PROMPT_FIELDS = _COMMON | {"prompt"}
TOKENIZE_CHAT_FIELDS = _COMMON | {
    "messages",
    "add_generation_prompt",
    "tools",
    "tool_choice",
    "chat_template_kwargs",
}
TOKENIZE_FIELDS = TOKENIZE_PROMPT_FIELDS | TOKENIZE_CHAT_FIELDS
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})
COUNT_TOKENS_FIELDS = (
    MESSAGES_FIELDS
    - {"max_tokens", "stream", "stop_sequences", "keep_alive"}
    - {
        "temperature",
        "top_p",
        "top_k",
    }
)


def tokenize(body: dict, tokenizer: ModelTokenizer, images: PromptImages = NO_IMAGES) -> dict:
    """vLLM's /tokenize: a `prompt` (string) or chat `messages` -> `tokens`, `count`,
    `max_model_len` (and `token_strs` when `return_token_strs` is true). Images count as the
    tokens they become, shown with the real image-token id."""
    if "messages" in body and "prompt" in body:
        raise bad_request("send either 'prompt' or 'messages', not both", "messages")
    if body.get("messages") is not None:
        refuse_unknown_fields(body, TOKENIZE_CHAT_FIELDS, "/tokenize")
        tools = parse_tools(body)
        ids = build_chat_prompt(
            chat_messages(body),
            tools,
            tokenizer,
            template_kwargs(body),
            add_generation_prompt=typed_field(body, "add_generation_prompt", bool, True),
            add_special_tokens=typed_field(body, "add_special_tokens", bool, False),
            images=images,
        ).token_ids
    else:
        refuse_unknown_fields(body, TOKENIZE_PROMPT_FIELDS, "/tokenize")
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad_request("'prompt' (a string) or 'messages' is required", "prompt")
        if typed_field(body, "add_special_tokens", bool, True):
            ids = tokenizer.encode_prompt(prompt)
        else:
            ids = tokenizer.encode_text(prompt)
    out = {"count": len(ids), "max_model_len": tokenizer.context_length, "tokens": list(ids)}
    out["token_strs"] = None
    if typed_field(body, "return_token_strs", bool, False):
        out["token_strs"] = tokenizer.token_strings(ids)
    return out


def detokenize(body: dict, tokenizer: ModelTokenizer, images: PromptImages = NO_IMAGES) -> dict:
    """vLLM's /detokenize: `tokens` -> `prompt` (special tokens kept, as vLLM does)."""
    refuse_unknown_fields(body, DETOKENIZE_FIELDS, "/detokenize")
    tokens = body.get("tokens")
    if not (isinstance(tokens, list) and all(type(t) is int for t in tokens)):
        raise bad_request("'tokens' must be an array of token ids", "tokens")
    if not all(0 <= t < tokenizer.vocab_size for t in tokens):
        raise bad_request(
            f"'tokens' holds an id outside the vocabulary [0, {tokenizer.vocab_size})", "tokens"
        )
    return {"prompt": tokenizer.decode(tokens, skip_special_tokens=False)}


def count_tokens(body: dict, tokenizer: ModelTokenizer, images: PromptImages = NO_IMAGES) -> dict:
    """Anthropic's /v1/messages/count_tokens: the prompt a /v1/messages body would make."""
    refuse_unknown_fields(body, COUNT_TOKENS_FIELDS, "/v1/messages/count_tokens")
    return {"input_tokens": len(messages_prompt(body, tokenizer, images).token_ids)}
