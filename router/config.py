"""Router settings; the command line in router/cli.py fills them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    """A served model as configured: where its files are and the names clients may use."""

    path: Path  # a local model directory: tokenizer files + config.json
    id: str | None = None  # the name clients use; defaults to the directory's name
    aliases: tuple[str, ...] = ()  # other names accepted for it

    @property
    def served_id(self) -> str:
        return self.id or Path(self.path).name

    @property
    def names(self) -> tuple[str, ...]:
        return (self.served_id, *self.aliases)


@dataclass(frozen=True)
class RouterConfig:
    # the served models, the first the default; each request names one in `model`
    models: tuple[ModelSpec, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    zmq_bind: str = "tcp://127.0.0.1:5555"  # "tcp://127.0.0.1:*" picks a free port
    policy: str = "cache_aware"
    prefill_weight: float = 0.1  # cost of one uncached prompt block, in queued requests
    balance_abs_threshold: int = 8
    balance_rel_threshold: float = 2.0
    prefix_ttl_s: float = 10.0  # life of an optimistic prefix entry without a KV event
    heartbeat_interval_s: float = 1.0  # told to workers in RegisterAck
    heartbeat_timeout_s: float = 5.0  # silence after which a worker is lost
    max_pending_requests: int = 1024  # requests in flight in the router; more get 429
    # tokenizing a 1.4k-token prompt costs ~2.3 ms of CPU, 85% of the router's work per
    # request; the HF tokenizer releases the GIL, so threads take it off the loop (0: don't)
    tokenizer_threads: int = 0
    max_resubmits: int = 3  # times one request may move to another worker after a failure
    # For every model: context length (default: each one's config.json), tool-call format
    # (hermes | llama3 | mistral; default: read from each one's template), chat template text
    context_length: int | None = None
    tool_call_parser: str | None = None
    chat_template: str | None = None
    # Security (docs/deploy.md). No keys = no authentication.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    max_body_bytes: int = 8 * 2**20  # larger request bodies get 413
    max_tokens_cap: int | None = None  # max_tokens above it is clamped to it
    per_key_concurrency: int | None = None  # requests in flight per API key; more get 429
    curve_secret_key: Path | None = None  # the router's CURVE secret key file...
    curve_authorized_keys: Path | None = None  # ...and the folder of workers' public keys

    @property
    def curve_enabled(self) -> bool:
        return self.curve_secret_key is not None

    @property
    def model_ids(self) -> tuple[str, ...]:
        return tuple(spec.served_id for spec in self.models)
