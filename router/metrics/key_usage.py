"""Usage per API key in /metrics, labelled by the key's fingerprint (never its text)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class KeyUsage:
    def __init__(self, registry: CollectorRegistry):
        def counter(name: str, doc: str, labels=("key",)) -> Counter:
            return Counter(name, doc, list(labels), registry=registry)

        self._requests = counter("mlx_fleet_key_requests", "requests let in, per API key")
        self._prompt = counter("mlx_fleet_key_prompt_tokens", "prompt tokens, per API key")
        self._completion = counter(
            "mlx_fleet_key_completion_tokens", "completion tokens, per API key"
        )
        self._limited = counter(
            "mlx_fleet_key_rate_limited",
            "requests refused with 429 for a key over its budget (limit: requests or tokens)",
            ("key", "limit"),
        )

    def admitted(self, key: str) -> None:
        self._requests.labels(key).inc()

    def refused(self, key: str, limit: str) -> None:
        self._limited.labels(key, limit).inc()

    def tokens(self, key: str, prompt: int, completion: int) -> None:
        self._prompt.labels(key).inc(prompt)
        self._completion.labels(key).inc(completion)
