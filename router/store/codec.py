"""A stored reply as bytes (compact JSON), the form the SQLite and Redis stores keep and the
form every store's byte bound counts."""

from __future__ import annotations

import json

from router.api.responses.store import StoredResponse


def encode(entry: StoredResponse) -> bytes:
    fields = {
        "response": entry.response,
        "input_items": entry.input_items,
        "context": entry.context,
        "stored_at": entry.stored_at,
        "cache_key": entry.cache_key,
        "owner": entry.owner,
    }
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()


def decode(data: bytes | str) -> StoredResponse:
    fields = json.loads(data)
    return StoredResponse(
        fields["response"],
        tuple(fields["input_items"]),
        tuple(fields["context"]),
        fields["stored_at"],
        fields["cache_key"],
        fields["owner"],
    )
