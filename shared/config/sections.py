"""The sections of the fleet config file, [model] / [[models]], [router], [worker], [cluster]:
every setting declared once, as a `spec` field (type, default, check, help, flag spelling).

The TOML keys are the field names; the commands' flags are made from the same fields
(shared/config/flags.py add_flags); RouterConfig (router/config.py) extends RouterSection and
EngineConfig (worker/config.py) takes its defaults from WorkerSection and ModelSection."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from shared.config.choices import (
    ATTENTION_BACKENDS,
    COMPUTE_DTYPES,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_KV_DISK_DIR,
    DEFAULT_KV_FRACTION,
    DEFAULT_KV_GROUP_SIZE,
    DEFAULT_MODEL_NAME,
    DEFAULT_ZMQ_ADDRESS,
    KV_BITS,
    LOG_LEVELS,
    POLICY_NAMES,
    SPECULATIVE_MODES,
    TOOL_CALL_PARSERS,
)
from shared.config.fields import (
    NO_FLAG,
    boolean,
    endpoint,
    integer,
    number,
    path,
    size,
    spec,
    string,
    strings,
)


@dataclass(frozen=True)
class ModelSection:
    path: str | None = spec(
        None, string(optional=True), "model directory, .gguf file or Hugging Face repo id"
    )
    id: str | None = spec(None, string(optional=True), "name clients send (default: dir name)")
    compute_dtype: str = spec(
        "auto",
        string(COMPUTE_DTYPES),
        "worker compute dtype: auto (float32 on CPU, quantized on Metal), float32, float16, "
        "bfloat16, quantized",
        show_choices=False,
    )
    # [[models]] entries: other names clients may send, and launch-cluster's workers for it
    aliases: tuple[str, ...] = spec((), strings(), "other names clients may send for it")
    workers: int | None = spec(
        None, integer(1, 256, optional=True), "launch-cluster: its workers (default cluster's)"
    )

    @property
    def name(self) -> str:
        """The name clients send: `id`, else the default model's, a GGUF's stem, a
        directory's or repo id's last part."""
        if self.id:
            return self.id
        if not self.path:
            return DEFAULT_MODEL_NAME
        path = Path(self.path)
        return path.stem if path.suffix == ".gguf" else path.name


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
        "docs/benchmarks.md, fleet simulation)",
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
    tool_call_parser: str | None = spec(
        None,
        string(TOOL_CALL_PARSERS, optional=True),
        "the tool-call format the model writes (default: read from its chat template)",
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
        8 * 2**20, size(optional=False), "larger request bodies are refused with 413"
    )
    max_tokens_cap: int | None = spec(
        None, integer(1, optional=True), "clamp every request's max_tokens to this"
    )
    responses_store_size: int = spec(
        512,
        integer(0),
        "/v1/responses replies kept in memory for previous_response_id and GET (0: none)",
    )
    responses_store_ttl_s: float = spec(
        3600.0,
        number(0.0, low_open=True),
        "seconds a stored /v1/responses reply is kept",
        flag="--responses-store-ttl",
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


@dataclass(frozen=True)
class WorkerSection:
    """Engine knobs left unset (None) take the engine's defaults, declared here as `unset`."""

    router: str = spec(DEFAULT_ZMQ_ADDRESS, endpoint(), "the router's ZeroMQ address")
    worker_id: str | None = spec(
        None, string(optional=True), "unique name of this worker (default: HOST-PID)"
    )
    kv_memory: int | None = spec(None, size(), "KV cache budget, e.g. 2GiB")
    kv_fraction: float | None = spec(
        None,
        number(0.0, 1.0, low_open=True),
        "KV budget as a share of device memory",
        unset=DEFAULT_KV_FRACTION,
    )
    block_size: int | None = spec(
        None, integer(1, optional=True), "tokens per KV block", unset=DEFAULT_BLOCK_SIZE
    )
    max_running: int | None = spec(
        None, integer(1, optional=True), "most sequences decoding at once", unset=64
    )
    prefill_chunk: int | None = spec(
        None, integer(1, optional=True), "most prompt tokens per sequence per step", unset=256
    )
    attention_backend: str = spec(
        "auto",
        string(ATTENTION_BACKENDS),
        "paged attention: auto (the Metal kernel where it passes its self-test at start, "
        "else MLX ops), metal, mlx",
    )
    speculative: str = spec(
        "off",
        string(SPECULATIVE_MODES),
        "speculative decoding: ngram (prompt-lookup drafts for greedy requests, verified in "
        "the batch; output unchanged) or off (it did not pay on CPUs measured)",
    )
    kv_disk: int | None = spec(
        None,
        size(),
        "keep KV blocks evicted from memory on disk, up to this size (e.g. 20GiB), and read "
        "them back when a prompt returns; survives restarts (default: off)",
    )
    kv_disk_dir: Path | None = spec(
        None, path(), f"folder of the disk tier (default {DEFAULT_KV_DISK_DIR})"
    )
    kv_bits: int | None = spec(
        None,
        integer(4, 16, optional=True),
        f"K/V bits in the KV pool, one of {', '.join(map(str, KV_BITS))}: 8 or 4 quantize "
        "(2-4x the cached tokens per byte; MLX-ops attention only) (default: the compute dtype)",
    )
    kv_group_size: int | None = spec(
        None,
        integer(32, 128, optional=True),
        "head-dim values sharing one scale and bias with --kv-bits 8/4: 32, 64 or 128",
        unset=DEFAULT_KV_GROUP_SIZE,
    )
    log_level: str = spec(
        "INFO",
        string(LOG_LEVELS, parse=str.upper),
        "DEBUG, INFO, WARNING, ERROR",
        show_choices=False,
    )
    curve_secret_key: Path | None = spec(
        None, path(), "this worker's CURVE secret key file (mlx-fleet-keys)"
    )
    curve_server_key: Path | None = spec(None, path(), "the router's CURVE public key file")
    # Tensor-parallel group across machines (one rank per entry, rank 0 first); see deploy.md
    tp_hosts: tuple[str, ...] = spec(
        (),
        strings(),
        "every rank's IP or IP:port, rank 0 first, e.g. 10.0.0.1,10.0.0.2",
    )
    tp_rank: int | None = spec(
        None, integer(0, optional=True), "this worker's rank (its place in --tp-hosts)"
    )
    tp_port: int = spec(52100, integer(1, 65535), "ring port of a host given without one")
    tp_timeout_s: float = spec(
        60.0,
        number(0.0, low_open=True),
        "a rank exits when its group makes no progress this long",
    )

    @property
    def curve_enabled(self) -> bool:
        return self.curve_secret_key is not None


@dataclass(frozen=True)
class ClusterSection:
    workers: int = spec(
        2,
        integer(1, 256),
        "worker processes per model ([[models]] workers = N sets one model's)",
    )
    tp: int = spec(
        1,
        integer(1, 64),
        "ranks per worker: each worker is one model replica sharded over K processes with "
        "tensor parallelism (mx.distributed ring); K must divide the model's heads",
    )


@dataclass(frozen=True)
class FleetConfig:
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    router: RouterSection = dataclasses.field(default_factory=RouterSection)
    worker: WorkerSection = dataclasses.field(default_factory=WorkerSection)
    cluster: ClusterSection = dataclasses.field(default_factory=ClusterSection)
    models: tuple[ModelSection, ...] = ()  # [[models]]: several models in one fleet
    source: Path | None = None  # the file it was read from

    @property
    def served_models(self) -> tuple[ModelSection, ...]:
        """[[models]], or the one [model]."""
        return self.models or (self.model,)


SECTIONS = {"model": ModelSection, "router": RouterSection, "worker": WorkerSection}
SECTIONS |= {"cluster": ClusterSection}
Section = TypeVar("Section", ModelSection, RouterSection, WorkerSection, ClusterSection)


def setting(section: type, name: str) -> dataclasses.Field:
    """The declaration of `section`'s setting `name`."""
    return next(f for f in dataclasses.fields(section) if f.name == name)


def default_of(section: type, name: str) -> Any:
    """The value a program uses for the setting when nobody sets it: the declared default,
    or for a key whose default is None ("the program's own"), its declared `unset` value."""
    declared = setting(section, name)
    if declared.default is None and declared.metadata["unset"] is not None:
        return declared.metadata["unset"]
    return declared.default
