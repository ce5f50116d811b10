"""The vectors of an embeddings request in OpenAI's reply.

Each vector arrives as float32 little-endian bytes (shared/protocol.py Embeddings); base64 is
those very bytes encoded (what OpenAI sends, and what its SDK decodes with numpy's float32),
`float` a JSON array of them."""

from __future__ import annotations

import base64
from collections.abc import Sequence

import numpy as np


def embeddings_reply(
    vectors: Sequence[bytes], encoding_format: str, model_id: str, prompt_tokens: int
) -> dict:
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(vector, encoding_format)}
        for i, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return {"object": "list", "data": data, "model": model_id, "usage": usage}


def _encode(vector: bytes, encoding_format: str):
    if encoding_format == "base64":
        return base64.b64encode(vector).decode("ascii")
    return np.frombuffer(vector, dtype="<f4").tolist()
