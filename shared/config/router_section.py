"""The [router] section: every router setting declared once (see shared/config/sections.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shared.config.choices import (
    DEFAULT_VOLATILE_PATTERNS,
    DEFAULT_ZMQ_ADDRESS,
    LOG_LEVELS,
    POLICY_NAMES,
    REASONING_PARSERS,
    RESPONSE_STORES,
    TOOL_CALL_PARSERS,
)
from shared.config.fields import (
    NO_FLAG,
    boolean,
    endpoint,
    integer,
    number,
    path,
    redis_url,
    regexes,
    size,
    spec,
    string,
    strings,
)


@dataclass(frozen=True)
class RouterSection:
    host: str = spec("127.0.0.1", string(), "HTTP address to bind")
    port: int = spec(8000, integer(1, 65535), "HTTP port")
    zmq_bind: str = spec(
        DEFAULT_ZMQ_ADDRESS, endpoint(), "ZeroMQ ROUTER address workers connect to"
    )
    policy: str = spec("cache_aware", string(POLICY_NAMES), "routing policy")
    prefill_weight: float = spec(
        0.1, number(0.0), "cache_aware: cost of one uncached prompt block, in queued requests"
    )
    balance_abs_threshold: int = spec(
        8, integer(0), "cache_aware: fall back to least-load when max - min load exceeds this..."
    )
    balance_rel_threshold: float = spec(
        2.0, number(1.0), "...and max load exceeds this times the min load"
    )
    kv_pulls: bool = spec(
        True,
        boolean(),
        "let a worker fetch a prompt's cached prefix from the worker holding it (any policy) "
        "when the measured link beats recomputing it (false: always recompute)",
    )
    prefill_timeout_s: float = spec(
        60.0,
        number(0.0, low_open=True),
        "disaggregated prefill: a prefill worker's answer not in this long, the decode "
        "worker computes the prompt itself",
        flag="--prefill-timeout",
    )
    prefill_min_tokens: int = spec(
        256,
        integer(0),
        "disaggregated prefill: a prompt with fewer uncached tokens than this (on the decode "
        "worker holding most of it) goes straight to a decode worker, which computes it in "
        "about one chunk: cheaper than a prefill leg and a pull",
    )
    prefix_ttl_s: float = spec(
        10.0,
        number(0.0, low_open=True),
        "seconds an optimistic prefix entry lives without a KV event",
        flag="--prefix-ttl",
    )
    heartbeat_interval_s: float = spec(
        1.0,
        number(0.0, low_open=True),
        "seconds between worker heartbeats (told to workers)",
        flag="--heartbeat-interval",
    )
    heartbeat_timeout_s: float = spec(
        5.0,
        number(0.0, low_open=True),
        "seconds of silence after which a worker is lost",
        flag="--heartbeat-timeout",
    )
    wedged_after_s: float = spec(
        30.0,
        number(0.0, low_open=True),
        "a worker with work whose step loop makes no progress this long is taken out of "
        "service (its requests move to other workers) until it does",
        flag="--wedged-after",
    )
    worker_wait_s: float = spec(
        30.0,
        number(0.0),
        "a request for a model whose workers are still starting (none has registered since "
        "the router started, this long ago at most), or whose worker was lost before its "
        "first token with no other up, waits this long for one (0: a 503 at once)",
    )
    # models placed by demand on host agents (router/placement/)
    load_timeout_s: float = spec(
        300.0,
        number(0.0, low_open=True),
        "a request for a catalog model no worker serves waits this long for one to load, "
        "then gets a 503 with Retry-After",
    )
    admin_keys: tuple[str, ...] = spec(
        (),
        strings(),
        "keys for the admin API (load, unload, pin models; /v1/admin); none set: only "
        "clients on this machine (loopback) may use it",
        flag="--admin-key",
    )
    max_pending_requests: int = spec(
        1024,
        integer(1),
        "requests in flight in the router; more are refused with 429",
        flag="--max-pending",
    )
    tokenizer_threads: int = spec(
        0,
        integer(0),
        "threads that tokenize prompts off the event loop (0: on the loop; see "
        "docs/benchmarks-history.md, router overhead per request)",
    )
    context_length: int | None = spec(
        None,
        integer(1, optional=True),
        "override the model's context length (default: config.json)",
    )
    log_level: str = spec(
        "INFO", string(LOG_LEVELS, parse=str.upper), "log level", show_choices=False
    )
    log_requests: bool = spec(
        False,
        boolean(),
        "log each HTTP request as one JSON line (request id, model, status, tokens, timing)",
    )
    otlp_endpoint: str | None = spec(
        None,
        string(optional=True),
        "export OpenTelemetry spans of each request to this OTLP/HTTP collector, e.g. "
        "http://127.0.0.1:4318 (default: $OTEL_EXPORTER_OTLP_ENDPOINT; unset: no tracing)",
        metavar="URL",
    )
    tool_call_parser: str | None = spec(
        None,
        string(TOOL_CALL_PARSERS, optional=True),
        "the tool-call format every model writes (default: each model's own, read from its "
        "chat template and vocabulary; [[models]] tool_call_parser sets one model's)",
    )
    reasoning_parser: str | None = spec(
        None,
        string(REASONING_PARSERS, optional=True),
        "how every model marks its reasoning (default: each model's own, as detected; "
        "[[models]] reasoning_parser sets one model's)",
    )
    volatile_prompt_patterns: tuple[str, ...] = spec(
        DEFAULT_VOLATILE_PATTERNS,
        regexes(),
        "regular expressions taken out of system messages before templating: per-request "
        "metadata that would break every cached prefix (default: Claude Code's "
        "x-anthropic-billing-header line); each match is counted in /metrics "
        "(mlx_fleet_volatile_prompt_removals); an empty list turns it off",
        flag="--volatile-prompt-pattern",
        metavar="REGEX",
    )
    chat_template: str | None = spec(
        None,
        string(optional=True),
        "override the model's chat template: a Jinja file, or the template itself",
        metavar="FILE_OR_TEXT",
    )
    # Security: API keys, limits, CURVE (see docs/deploy.md).
    api_keys: tuple[str, ...] = spec((), strings(), "accepted API keys", flag=NO_FLAG, repr=False)
    api_keys_file: Path | None = spec(
        None,
        path(),
        "API keys clients must send as 'Authorization: Bearer KEY', one a line "
        "(keys are never accepted on the command line: ps would show them)",
        metavar="FILE",
    )
    max_body_bytes: int = spec(
        48 * 2**20,
        size(optional=False),
        "larger request bodies are refused with 413 (images travel in the body, as base64: "
        "keep it above 4/3 of max_request_image_bytes)",
    )
    # Images in prompts (vision-language models; docs/api.md "Images").
    max_images: int = spec(8, integer(0), "images one request may hold; more get 400")
    max_image_bytes: int = spec(
        20 * 2**20, size(optional=False), "an image's encoded size (PNG, JPEG...); larger get 400"
    )
    max_request_image_bytes: int = spec(
        32 * 2**20,
        size(optional=False),
        "all of one request's images together (they travel to the worker in one frame, "
        "capped at 64 MiB)",
    )
    max_image_pixels: int = spec(
        40_000_000,
        integer(1),
        "an image's width x height, read from its header before it is decoded (a "
        "decompression bomb is refused unread)",
    )
    image_fetch: bool = spec(
        False,
        boolean(),
        "fetch http(s) image URLs that requests name (off: only data URLs and base64 blocks; "
        "on, the router reaches any address a client names: keep it off on a shared network)",
    )
    image_fetch_timeout_s: float = spec(
        10.0,
        number(0.0, low_open=True),
        "seconds one image URL may take to fetch (image_fetch)",
        flag="--image-fetch-timeout",
    )
    max_tokens_cap: int | None = spec(
        None, integer(1, optional=True), "clamp every request's max_tokens to this"
    )
    # Stored /v1/responses replies and per-key budgets (router/store/; docs/deploy.md).
    state_url: str | None = spec(
        None,
        redis_url(),
        "a Redis (or Valkey) server holding the stored /v1/responses replies and the per-key "
        "budgets, shared by every router of the fleet (unset: each router keeps its own)",
        metavar="redis://HOST:PORT/DB",
    )
    placement_lease_s: float = spec(
        5.0,
        number(2.0),
        "with state_url: seconds the placement leader's lease lasts unrenewed (it renews it "
        "every second); when the leader dies, another router takes placement over this long "
        "after",
        flag="--placement-lease",
    )
    responses_store: str | None = spec(
        None,
        string(RESPONSE_STORES, optional=True),
        "where stored /v1/responses replies live: sqlite (a file: they outlive a restart), "
        "memory (this process: a restart forgets them), redis (the --state-url server)",
        unset="redis with --state-url, else sqlite",
    )
    responses_store_path: Path | None = spec(
        None,
        path(),
        "the sqlite store's file (default: $XDG_CACHE_HOME, else ~/.cache, "
        "/mlx-fleet/responses-PORT.sqlite3: one per router)",
        metavar="FILE",
    )
    responses_store_size: int = spec(
        10_000,
        integer(0),
        "stored /v1/responses replies kept for previous_response_id and GET; past it the "
        "oldest go first (0: none)",
    )
    responses_store_bytes: int = spec(
        256 * 2**20,
        size(optional=False),
        "the stored replies' total size (their JSON); past it the oldest go first",
    )
    responses_store_ttl_s: float = spec(
        30 * 86400.0,
        number(0.0, low_open=True),
        "seconds a stored /v1/responses reply is kept (OpenAI keeps them 30 days)",
        flag="--responses-store-ttl",
    )
    # The Batch API (docs/api.md "Batches and files"): files and progress live in the store
    # the responses use (SQLite beside it, or the state_url Redis).
    batch_file_max_bytes: int = spec(
        32 * 2**20,
        size(optional=False),
        "an uploaded file's size (POST /v1/files); larger get 413 (keep it under "
        "max_body_bytes, which bounds the whole upload)",
    )
    batch_file_max_lines: int = spec(
        50_000, integer(1), "requests one batch file may hold (OpenAI's bound); more get 400"
    )
    batch_lines_per_worker: int = spec(
        8,
        integer(1),
        "a batch's lines in flight per healthy worker (they fill free slots at low priority)",
    )
    batch_yield_s: float = spec(
        2.0,
        number(0.0),
        "a worker that ran an interactive request this recently takes a quarter of "
        "batch_lines_per_worker batch lines, as while one runs (0: only while one runs)",
        flag="--batch-yield",
    )
    per_key_concurrency: int | None = spec(
        None, integer(1, optional=True), "requests in flight per API key; more get 429"
    )
    key_rpm: int | None = spec(
        None,
        integer(1, optional=True),
        "requests per minute per API key (a key's line in the keys file may set its own: "
        "KEY rpm=N); more get 429 with Retry-After",
    )
    key_tpm: int | None = spec(
        None,
        integer(1, optional=True),
        "prompt + completion tokens per minute per API key (KEY tpm=N in the keys file); "
        "over it, requests get 429 with Retry-After",
    )
    curve_secret_key: Path | None = spec(
        None, path(), "the router's CURVE secret key file", metavar="FILE"
    )
    curve_authorized_keys: Path | None = spec(
        None,
        path(),
        "folder of the public keys of the workers allowed to connect",
        metavar="DIR",
    )

    @property
    def curve_enabled(self) -> bool:
        return self.curve_secret_key is not None
