"""/v1/embeddings bodies: OpenAI's four input forms read as token ids, the reply in both
encodings, and every bad input a 400 naming its field (never a 500)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from router.api.embeddings.parse import MAX_INPUTS, parse_embeddings
from router.api.embeddings.render import embeddings_reply
from router.errors import ApiError
from router.text.tokenizer import ModelTokenizer
from shared.models.embedding import EmbeddingSpec, embedding_spec
from tests.support.arch_zoo.embedders import save_bert_embedder

SPEC = EmbeddingSpec("mean", True, 32, False, True)
MRL = EmbeddingSpec("last", True, 32, True, False)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    directory = save_bert_embedder(tmp_path_factory.mktemp("bert") / "m")
    assert embedding_spec(directory).pooling == "mean"
    return ModelTokenizer.load(directory)


def parse(tokenizer, spec=SPEC, **body):
    return parse_embeddings({"model": "m", **body}, tokenizer, spec, "m")


def test_the_four_input_forms(tokenizer):
    one = parse(tokenizer, input="w5 w6 w7")
    assert one.inputs == [[2, 5, 6, 7, 3]]  # [CLS] ... [SEP]: the tokenizer's own specials
    assert parse(tokenizer, input=["w5", "w9 w10"]).inputs == [[2, 5, 3], [2, 9, 10, 3]]
    assert parse(tokenizer, input=[7, 8, 9]).inputs == [[7, 8, 9]]
    many = parse(tokenizer, input=[[7, 8], [9]], user="u-1", encoding_format="base64")
    assert many.inputs == [[7, 8], [9]] and many.encoding_format == "base64"
    assert many.prompt_tokens == 3


def test_dimensions_only_where_the_model_truncates(tokenizer):
    assert parse(tokenizer, MRL, input="w5", dimensions=8).dimensions == 8
    assert parse(tokenizer, SPEC, input="w5", dimensions=32).dimensions == 0  # its full width
    with pytest.raises(ApiError, match="does not support 'dimensions'") as caught:
        parse(tokenizer, SPEC, input="w5", dimensions=8)
    assert caught.value.param == "dimensions"
    for bad in (0, 33, "8", 8.5):
        with pytest.raises(ApiError) as caught:
            parse(tokenizer, MRL, input="w5", dimensions=bad)
        assert caught.value.status == 400 and caught.value.param == "dimensions"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"input": ""},
        {"input": []},
        {"input": [[]]},
        {"input": ["w5", ""]},
        {"input": ["w5", [5]]},
        {"input": [1.5]},
        {"input": [True]},
        {"input": {"text": "w5"}},
        {"input": 5},
        {"input": [[5, -1]]},
        {"input": [[5, 10_000]]},
        {"input": ["w5"] * (MAX_INPUTS + 1)},
        {"input": [[5] * 129]},  # over the model's 128 positions
        {"input": "w5", "encoding_format": "binary"},
        {"input": "w5", "user": 7},
        {"input": "w5", "truncate": True},
    ],
)
def test_bad_inputs_are_400s_naming_the_field(tokenizer, body):
    with pytest.raises(ApiError) as caught:
        parse(tokenizer, **body)
    error = caught.value
    assert error.status == 400 and error.param in ("input", "encoding_format", "user", "truncate")
    assert error.message


def test_reply_in_floats_and_in_base64():
    vectors = [np.array([0.6, 0.8], dtype="<f4").tobytes(), np.array([1, 0], "<f4").tobytes()]
    floats = embeddings_reply(vectors, "float", "m", 5)
    assert floats["object"] == "list" and floats["model"] == "m"
    assert floats["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert [d["index"] for d in floats["data"]] == [0, 1]
    assert np.allclose(floats["data"][0]["embedding"], [0.6, 0.8])
    b64 = embeddings_reply(vectors, "base64", "m", 5)["data"][0]["embedding"]
    assert np.allclose(np.frombuffer(base64.b64decode(b64), dtype=np.float32), [0.6, 0.8])
