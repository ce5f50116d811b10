"""An OpenAI embeddings body -> the token ids of each input, checked against the model.

`input` is a string, an array of strings, an array of token ids or an array of such arrays
(OpenAI's four forms); strings are tokenized with the model's tokenizer and its special
tokens (BERT's [CLS] ... [SEP], Qwen3-Embedding's closing <|endoftext|>), token arrays are
taken as they are. Everything a client can get wrong is a 400 naming the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.api.checks import refuse_unknown_fields, typed_field
from router.errors import bad_request

if TYPE_CHECKING:
    from router.text.tokenizer import ModelTokenizer
    from shared.models.embedding import EmbeddingSpec

FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user", "keep_alive"})
ENCODING_FORMATS = ("float", "base64")
MAX_INPUTS = 2048  # OpenAI's limits: inputs per request, tokens over all of them
MAX_TOTAL_TOKENS = 300_000


@dataclass(frozen=True)
class EmbeddingRequest:
    inputs: list[list[int]]
    encoding_format: str = "float"
    dimensions: int = 0  # 0: the model's full vector

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.inputs)


def parse_embeddings(
    body: dict, tokenizer: ModelTokenizer, spec: EmbeddingSpec, model_id: str
) -> EmbeddingRequest:
    refuse_unknown_fields(body, FIELDS, "/v1/embeddings")
    typed_field(body, "user", str, None)  # accepted, without effect: nothing is recorded
    encoding = typed_field(body, "encoding_format", str, "float")
    if encoding not in ENCODING_FORMATS:
        raise bad_request(
            f"'encoding_format' must be one of {', '.join(ENCODING_FORMATS)}, got {encoding!r}",
            "encoding_format",
        )
    dimensions = _dimensions(body, spec, model_id)
    inputs = [_token_ids(item, i, tokenizer) for i, item in enumerate(_items(body.get("input")))]
    limit = tokenizer.context_length
    for i, ids in enumerate(inputs):
        if len(ids) > limit:
            raise bad_request(
                f"input[{i}] has {len(ids)} tokens, more than this model's {limit}; "
                "shorten it or split it",
                "input",
                "context_length_exceeded",
            )
    total = sum(len(ids) for ids in inputs)
    if total > MAX_TOTAL_TOKENS:
        raise bad_request(
            f"the inputs hold {total} tokens together, more than the {MAX_TOTAL_TOKENS} one "
            "request may; send them in several requests",
            "input",
        )
    return EmbeddingRequest(inputs, encoding, dimensions)


def _dimensions(body: dict, spec: EmbeddingSpec, model_id: str) -> int:
    dimensions = typed_field(body, "dimensions", int, None)
    if dimensions is None or dimensions == spec.dimensions:
        return 0
    if not spec.matryoshka:
        raise bad_request(
            f"the model '{model_id}' does not support 'dimensions': its vectors are "
            f"{spec.dimensions} values and are not trained to be truncated",
            "dimensions",
        )
    if not 1 <= dimensions <= spec.dimensions:
        raise bad_request(
            f"'dimensions' must be between 1 and {spec.dimensions} for '{model_id}', "
            f"got {dimensions}",
            "dimensions",
        )
    return dimensions


def _items(value) -> list:
    """The inputs as a list: strings, or arrays of token ids."""
    if value is None:
        raise bad_request("'input' is required", "input")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise bad_request(
            "'input' must be a string, an array of strings, an array of token ids or an array "
            "of token-id arrays",
            "input",
        )
    if not value:
        raise bad_request("'input' must not be an empty array", "input")
    if all(type(v) is int for v in value):
        return [value]  # one input, as token ids
    if not (all(isinstance(v, str) for v in value) or all(isinstance(v, list) for v in value)):
        raise bad_request(
            "'input' must be all strings or all arrays of token ids, not a mix", "input"
        )
    if len(value) > MAX_INPUTS:
        raise bad_request(
            f"'input' holds {len(value)} inputs, more than the {MAX_INPUTS} one request may",
            "input",
        )
    return value


def _token_ids(item, i: int, tokenizer: ModelTokenizer) -> list[int]:
    if isinstance(item, str):
        if not item:
            raise bad_request(f"input[{i}] is an empty string", "input")
        return tokenizer.encode_prompt(item)
    if not isinstance(item, list) or not all(type(t) is int for t in item):
        raise bad_request(
            f"input[{i}] must be a string or an array of token ids (integers)",
            "input",
        )
    if not item:
        raise bad_request(f"input[{i}] is an empty array of token ids", "input")
    vocab = tokenizer.vocab_size
    bad = next((t for t in item if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(
            f"input[{i}] holds token id {bad}, outside the vocabulary (0..{vocab - 1})", "input"
        )
    return list(item)
