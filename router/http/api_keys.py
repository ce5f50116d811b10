"""The router's API keys: held and compared as sha256 digests, named in logs by an
8-hex-digit fingerprint (`mlx-fleet-keys api-key` prints the same), never by their text."""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter
from collections.abc import Iterable


def key_fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:8]


class ApiKeys:
    """The accepted keys, and how many requests each has in flight."""

    def __init__(self, accepted: Iterable[str], per_key_concurrency: int | None):
        self._digests = {hashlib.sha256(k.encode()).digest(): key_fingerprint(k) for k in accepted}
        self._limit = per_key_concurrency
        self._in_flight: Counter[str] = Counter()

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    @property
    def fingerprints(self) -> list[str]:
        return sorted(self._digests.values())

    def identify(self, presented: str) -> str | None:
        """The fingerprint of the accepted key equal to `presented`, or None."""
        # aiohttp decodes header bytes that are not UTF-8 as lone surrogates: back to the bytes
        # sent (a strict encode raised, and a hostile header was a 500, not a 401)
        digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        # Compare digests, every one, in constant time: no early exit to time.
        found = None
        for known, name in self._digests.items():
            if hmac.compare_digest(known, digest):
                found = name
        return found

    def can_start(self, key_id: str) -> bool:
        return self._limit is None or self._in_flight[key_id] < self._limit

    def start(self, key_id: str) -> None:
        self._in_flight[key_id] += 1

    def done(self, key_id: str) -> None:
        self._in_flight[key_id] -= 1
        if not self._in_flight[key_id]:
            del self._in_flight[key_id]

    @property
    def limit(self) -> int | None:
        return self._limit
