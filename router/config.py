"""Router settings; the command line in router/server.py fills them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class RouterConfig:
    model_dir: Path  # a local model directory: tokenizer files + config.json
    model_id: str | None = None  # the name clients use; defaults to the directory's name
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
    context_length: int | None = None  # defaults to config.json's max_position_embeddings
    tool_call_parser: str | None = None  # hermes | llama3 | mistral; None = from the template
    chat_template: str | None = None  # the template's text (--chat-template); None = the model's
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
    def served_model_id(self) -> str:
        return self.model_id or Path(self.model_dir).name
