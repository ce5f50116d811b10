"""The sections of the fleet config file, [model] / [[models]], [router], [worker], [cluster]:
every setting declared once, as a `spec` field (type, default, check, help, flag spelling).

The TOML keys are the field names; the commands' flags are made from the same fields
(shared/config/flags.py add_flags); RouterConfig (router/config.py) extends RouterSection and
EngineConfig (worker/config.py) takes its defaults from WorkerSection and ModelSection."""

from __future__ import annotations

import dataclasses
import re
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
    HUB_REPO_ID,
    KV_BITS,
    LOG_LEVELS,
    MODEL_TASKS,
    REASONING_PARSERS,
    SPECULATIVE_MODES,
    TOOL_CALL_PARSERS,
    WORKER_ROLES,
)
from shared.config.fields import (
    boolean,
    endpoint,
    endpoints,
    integer,
    number,
    path,
    size,
    spec,
    string,
    strings,
)
from shared.config.host_section import HostSection
from shared.config.router_section import RouterSection


@dataclass(frozen=True)
class ModelSection:
    path: str | None = spec(
        None, string(optional=True), "model directory, .gguf file or Hugging Face repo id"
    )
    # a catalog model fetched by the host agents that load it (shared/models/hub.py)
    source: str | None = spec(
        None,
        string(optional=True),
        "Hub repo (org/name) host agents fetch the model from, checked (instead of path)",
    )
    revision: str | None = spec(
        None, string(optional=True), "with source: the branch, tag or commit (default: main)"
    )
    allow_patterns: tuple[str, ...] | None = spec(
        None,
        strings(),
        "with source: the repo's files to fetch (default: *.json *.safetensors *.py "
        "tokenizer.model *.tiktoken *.txt)",
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
    tool_call_parser: str | None = spec(
        None,
        string(TOOL_CALL_PARSERS, optional=True),
        "the tool-call format this model writes (default: detected; docs/api.md lists them)",
    )
    reasoning_parser: str | None = spec(
        None,
        string(REASONING_PARSERS, optional=True),
        "how this model marks its reasoning (default: detected)",
    )
    task: str | None = spec(
        None,
        string(MODEL_TASKS, optional=True),
        "chat or embed (default: detected from config.json and sentence-transformers files)",
    )
    # the catalog: how host agents' workers are placed for it (router/placement/)
    memory: int | None = spec(
        None, size(), "its workers' memory: weights + KV + runtime (default: estimated)"
    )
    kv_memory: int | None = spec(None, size(), "KV budget of a worker a host agent starts")
    min_workers: int = spec(0, integer(0, 256), "workers kept loaded, demand or not")
    max_workers: int = spec(1, integer(1, 256), "most workers demand may start for it")
    keep_alive: float = spec(
        300.0, number(-1.0), "seconds an idle worker stays loaded (-1: for ever, 0: unload at once)"
    )
    pinned: bool = spec(False, boolean(), "never unloaded to make room for another model")

    def source_problem(self) -> str | None:
        """Why `source`, `revision`, `allow_patterns` and `path` do not go together, or None."""
        if self.source is None:
            given = [k for k in ("revision", "allow_patterns") if getattr(self, k) is not None]
            return f"{given[0]} is only read with source (a Hub repo)" if given else None
        if self.path is not None:
            return "set path (local files) or source (a Hub repo), not both"
        if self.allow_patterns == ():
            return "allow_patterns is empty: it would fetch no file"
        if self.revision == "":
            return "revision is empty (leave it out for main)"
        if not re.match(HUB_REPO_ID, self.source) or ".." in self.source:
            return (
                f"source {self.source!r} is not a Hub repo id (expected org/name, like "
                "mlx-community/Qwen3-0.6B-4bit)"
            )
        return None

    @property
    def name(self) -> str:
        """The name clients send: `id`, else the default model's, a GGUF's stem, a
        directory's, repo id's or source's last part."""
        if self.id:
            return self.id
        if self.source:
            return self.source.rsplit("/", 1)[-1]
        if not self.path:
            return DEFAULT_MODEL_NAME
        path = Path(self.path)
        return path.stem if path.suffix == ".gguf" else path.name


@dataclass(frozen=True)
class WorkerSection:
    """Engine knobs left unset (None) take the engine's defaults, declared here as `unset`."""

    router: tuple[str, ...] = spec(
        (DEFAULT_ZMQ_ADDRESS,),
        endpoints(),
        "the router's ZeroMQ address; several routers serving one fleet: repeat the flag "
        "(or a TOML list), and the worker serves each of them",
    )
    worker_id: str | None = spec(
        None, string(optional=True), "unique name of this worker (default: HOST-PID)"
    )
    memory_budget: int | None = spec(
        None,
        size(),
        "this worker's memory: weights + KV pool + a step's activations, e.g. 8GiB (default: "
        "Metal's recommended working set, else 3/4 of RAM); sizes the pool and the step",
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
    watchdog_s: float = spec(
        120.0,
        number(0.0),
        "exit (code 75, for launch-cluster to restart it) when the step loop has been stuck "
        "this long (0: never)",
        flag="--watchdog",
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
    pin_share: float = spec(
        0.5,
        number(0.0, 1.0),
        "most of the KV pool that cache pins (Anthropic cache_control, OpenAI "
        "prompt_cache_retention) may hold, 0-1; past it the oldest pins are released (0: none)",
    )
    batch_hold_s: float = spec(
        0.15,
        number(0.0, 10.0),
        "when the last interactive request on a worker ends, batch (Batch API) work waits "
        "this long for the next one before it runs again, so a client that sends its next "
        "request at once finds the worker free (0: no wait)",
        flag="--batch-hold",
    )
    log_level: str = spec(
        "INFO",
        string(LOG_LEVELS, parse=str.upper),
        "DEBUG, INFO, WARNING, ERROR",
        show_choices=False,
    )
    otlp_endpoint: str | None = spec(
        None,
        string(optional=True),
        "export OpenTelemetry spans (queue, prefill chunks, decode) to this OTLP/HTTP "
        "collector (default: $OTEL_EXPORTER_OTLP_ENDPOINT; unset: no tracing)",
        metavar="URL",
    )
    kv_events_publish: str | None = spec(
        None,
        endpoint(optional=True),
        "also publish KV events in vLLM's format on a ZeroMQ PUB socket bound here (e.g. "
        "tcp://*:5557), for an external KV-aware router (Dynamo, llm-d, SGLang's gateway); "
        "launch-cluster gives worker i the port + i (default: off)",
        metavar="ADDR",
    )
    kv_events_replay: str | None = spec(
        None,
        endpoint(optional=True),
        "with --kv-events-publish: a ROUTER socket bound here replays missed batches, as "
        "vLLM's publisher does (default: off)",
        metavar="ADDR",
    )
    kv_events_topic: str | None = spec(
        None,
        string(optional=True),
        "ZeroMQ topic of the published KV events (default: none)",
        metavar="TOPIC",
    )
    curve_secret_key: Path | None = spec(
        None, path(), "this worker's CURVE secret key file (mlx-fleet-keys)"
    )
    curve_server_key: Path | None = spec(None, path(), "the router's CURVE public key file")
    # peer block transfer (issue 22): the KV endpoint other workers fetch blocks from
    kv_peer_bind: str = spec(
        "auto",
        endpoint(("auto", "off")),
        "where this worker serves its KV blocks to peers (port 0: a free one); auto: a "
        "loopback port when the router is on loopback, else off; off: none",
    )
    role: str = spec(
        "both",
        string(WORKER_ROLES),
        "both: prefill and decode its requests; prefill: compute prompts' K/V for decode "
        "workers to pull (disaggregated prefill); decode: decode what a prefill worker computed",
    )
    kv_peer_key: Path | None = spec(
        None,
        path(),
        "CURVE secret key file shared by the fleet's workers for the KV channel (required "
        "when --kv-peer-bind is not loopback)",
    )
    kv_peer_timeout_s: float = spec(
        8.0,
        number(0.1, 600.0),
        "longest wait for a peer's KV blocks (the whole fetch, the holder's turn included); "
        "past it the worker computes the prompt itself",
        flag="--kv-peer-timeout",
    )
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
    routers: int = spec(
        1,
        integer(1, 16),
        "launch-cluster: routers on this machine, each serving every worker (HTTP and ZeroMQ "
        "ports in sequence from the first's); put a TCP load balancer in front (docs/deploy.md)",
    )
    prefill_workers: int = spec(
        0,
        integer(0, 256),
        "launch-cluster: worker processes per model that only prefill (role prefill); the "
        "`workers` then decode (role decode); 0: every worker does both",
    )


@dataclass(frozen=True)
class WorkerGroup:
    """One [[workers]] entry: `count` workers of launch-cluster's, per model, of one role
    (the entries replace [cluster] workers and prefill_workers)."""

    role: str = spec("both", string(WORKER_ROLES), "these workers' role ([worker] role)")
    count: int = spec(1, integer(1, 256), "how many")


@dataclass(frozen=True)
class FleetConfig:
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    router: RouterSection = dataclasses.field(default_factory=RouterSection)
    worker: WorkerSection = dataclasses.field(default_factory=WorkerSection)
    cluster: ClusterSection = dataclasses.field(default_factory=ClusterSection)
    host: HostSection = dataclasses.field(default_factory=HostSection)
    models: tuple[ModelSection, ...] = ()  # [[models]]: several models in one fleet
    workers: tuple[WorkerGroup, ...] = ()  # [[workers]]: launch-cluster's workers by role
    source: Path | None = None  # the file it was read from

    @property
    def served_models(self) -> tuple[ModelSection, ...]:
        """[[models]], or the one [model]."""
        return self.models or (self.model,)


SECTIONS = {"model": ModelSection, "router": RouterSection, "worker": WorkerSection}
SECTIONS |= {"cluster": ClusterSection, "host": HostSection}
Section = TypeVar(
    "Section", ModelSection, RouterSection, WorkerSection, ClusterSection, HostSection
)


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
