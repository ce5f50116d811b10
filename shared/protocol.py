"""The router <-> worker wire protocol: typed messages in msgpack frames.

One frame = msgpack array `[tag, body]`: `tag` an int from MESSAGE_TYPES, `body` a map of the
message's fields by name. KV events inside KVEvents are `[event_tag, body]` (KV_EVENT_TYPES).
Unknown body keys are ignored (a newer peer may add optional fields); a missing field without
a default, a wrong type, an unknown tag or bad msgpack raises ProtocolError, which a receiver
logs and drops. PROTOCOL_VERSION is checked once, at registration.

Sockets: the router binds a ZeroMQ ROUTER socket; each worker connects one DEALER socket and
sends single-frame messages; Register first, then it waits for RegisterAck."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field

import msgpack

from shared.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from shared.sampling import SamplingParams

# 2: logit processing, top_logprobs; 3: prompt_logprobs, min_tokens (older workers: refused)
PROTOCOL_VERSION = 3
MAX_FRAME_BYTES = 64 * 1024 * 1024


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol."""


# ---------------------------------------------------------------- worker -> router


@dataclass(frozen=True, slots=True)
class AttentionReport:
    """Which paged-attention backend a worker chose at start, and why."""

    backend: str  # "metal" | "mlx"
    requested: str  # "auto" | "metal" | "mlx"
    self_test: str = ""  # "passed", "failed: ...", "not run: ..."
    candidate_ms: float | None = None  # the Metal kernel on the self-test's decode shape
    reference_ms: float | None = None  # the MLX-ops backend on the same shape
    kv_layout: str = ""  # what attention reads: "float32", "q8g64" (--kv-bits 8, groups of 64)
    kv_bytes_per_token: int = 0  # K and V, all layers


@dataclass(frozen=True, slots=True)
class RankReport:
    """One process of a tensor-parallel worker group."""

    rank: int
    host: str
    pid: int


@dataclass(frozen=True, slots=True)
class GroupReport:
    """The ranks that serve this worker's one model replica with tensor parallelism (rank 0
    is the worker the router talks to)."""

    size: int
    ranks: tuple[RankReport, ...] = ()


@dataclass(frozen=True, slots=True)
class Register:
    """First message of a worker; re-sent after a restart (its old state is dropped)."""

    worker_id: str
    model_id: str
    block_size: int
    kv_capacity_blocks: int
    host: str
    pid: int
    protocol_version: int = PROTOCOL_VERSION
    attention: AttentionReport | None = None
    group: GroupReport | None = None  # None: one process holds the whole model


@dataclass(frozen=True, slots=True)
class WorkerPhases:
    """Where a worker's step time goes (recent window; see worker/engine/stats.py)."""

    decode_tick_p50_ms: float = 0.0
    decode_tick_p95_ms: float = 0.0
    decode_spikes: int = 0  # ticks over 200 ms, since start
    decode_spike_seconds: float = 0.0
    decode_batch_mean: float = 0.0
    decode_blocks_mean: float = 0.0  # KV blocks one decode tick reads
    decode_kv_bytes_mean: float = 0.0  # K/V bytes one decode tick reads
    prefill_chunk_p50_ms: float = 0.0
    kv_write_ms_p50: float = 0.0  # sampled steps, all layers
    attention_ms_p50: float = 0.0  # sampled steps, all layers
    decode_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    spec_drafted: int = 0  # speculative draft tokens proposed, since start
    spec_accepted: int = 0  # ...and accepted by the target model


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Load and cache state, every `heartbeat_interval_s` (from RegisterAck)."""

    worker_id: str
    running: int  # sequences in the running batch
    waiting: int  # queued, not yet prefilling
    free_blocks: int
    total_blocks: int
    cached_blocks: int  # in the prefix cache, not held by any sequence
    hit_tokens: int  # cumulative prompt tokens served from the prefix cache
    prompt_tokens: int = 0  # cumulative prompt tokens seen (hit rate = hit / prompt)
    phases: WorkerPhases | None = None
    # optional (an older worker leaves them 0): the router's view of KV pressure
    evictable_blocks: int = 0  # cached blocks no running request holds
    evicted_blocks: int = 0  # cumulative blocks the prefix cache evicted
    loop_turns: int = 0  # engine loop turns so far: busy and not rising = stuck; 0 = unknown


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class TopLogprobs:
    """The most likely tokens at one position, most likely first (log-probabilities)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """New tokens of one request; the last delta has finish_reason (and usage)."""

    request_id: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    usage: Usage | None = None
    logprobs: tuple[float, ...] | None = None
    error: str | None = None  # with finish_reason "error": what went wrong
    index: int = 0  # which of the request's n choices (Generate.n)
    top_logprobs: tuple[TopLogprobs, ...] | None = None  # per token, with top_logprobs > 0
    prompt_logprobs: tuple[float, ...] | None = None  # prompt tokens 1.., in a first delta
    prompt_ranks: tuple[int, ...] | None = None  # of those tokens; 1: the most likely
    prompt_top_logprobs: tuple[TopLogprobs, ...] | None = None  # with prompt_logprobs > 0


@dataclass(frozen=True, slots=True)
class KVEvents:
    """Prefix-cache changes, in the order they happened."""

    worker_id: str
    events: tuple[KVEvent, ...]


# ---------------------------------------------------------------- router -> worker


@dataclass(frozen=True, slots=True)
class RegisterAck:
    accepted: bool
    reason: str = ""  # why not, when not accepted
    protocol_version: int = PROTOCOL_VERSION
    heartbeat_interval_s: float = 1.0


@dataclass(frozen=True, slots=True)
class Generate:
    """Start a request. The worker answers with TokenDeltas, or one error delta."""

    request_id: str
    token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # choices from one prefill (the worker forks it), each with its index and finish delta
    n: int = 1
    trace_context: dict[str, str] | None = None  # W3C traceparent/tracestate (tracing on)


@dataclass(frozen=True, slots=True)
class Abort:
    """Stop a request and free its blocks; no further deltas are needed."""

    request_id: str
    index: int | None = None  # only this choice of an n > 1 request


@dataclass(frozen=True, slots=True)
class Shutdown:
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ReRegister:
    """The router does not know the sender (it restarted, or dropped the worker): register again."""

    reason: str = ""


Message = (
    Register
    | Heartbeat
    | TokenDelta
    | KVEvents
    | RegisterAck
    | Generate
    | Abort
    | Shutdown
    | ReRegister
)

# Tags are the wire contract: never renumber, only add.
MESSAGE_TYPES: dict[int, type] = {
    1: Register,
    2: Heartbeat,
    3: TokenDelta,
    4: KVEvents,
    10: RegisterAck,
    11: Generate,
    12: Abort,
    13: Shutdown,
    14: ReRegister,
}
KV_EVENT_TYPES: dict[int, type] = {1: BlockStored, 2: BlockRemoved, 3: AllBlocksCleared}

_MESSAGE_TAGS = {cls: tag for tag, cls in MESSAGE_TYPES.items()}
_KV_EVENT_TAGS = {cls: tag for tag, cls in KV_EVENT_TYPES.items()}


def encode(msg: Message) -> bytes:
    """One message as a msgpack frame."""
    tag = _MESSAGE_TAGS.get(type(msg))
    if tag is None:
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
    return msgpack.packb([tag, _fields_to_wire(msg)], use_bin_type=True)


def decode(frame: bytes) -> Message:
    """Parse one frame; ProtocolError on anything that is not a valid message."""
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes is over {MAX_FRAME_BYTES}")
    try:
        raw = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises many types for garbage; all mean the same here
        raise ProtocolError(f"bad msgpack: {e}") from None
    cls, body = _tagged(raw, MESSAGE_TYPES, "message")
    return _from_wire_fields(cls, body, cls.__name__)


# ---------------------------------------------------------------- encoding


def _fields_to_wire(obj) -> dict:
    return {f.name: _to_wire(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


_SCALARS = (int, float, str, bool, bytes, type(None))


def _to_wire(value):
    if type(value) in _SCALARS:
        return value
    if type(value) in _KV_EVENT_TAGS:
        return [_KV_EVENT_TAGS[type(value)], _fields_to_wire(value)]
    if dataclasses.is_dataclass(value):
        return _fields_to_wire(value)
    if isinstance(value, tuple | list):
        # token ids (a Generate's bulk) as they are: walking them was 75% of routing CPU
        if all(type(v) is int for v in value):
            return value
        return [_to_wire(v) for v in value]
    return value


# ---------------------------------------------------------------- decoding


def _tagged(raw, table: dict[int, type], what: str) -> tuple[type, dict]:
    if not (isinstance(raw, list) and len(raw) == 2):
        raise ProtocolError(f"{what} must be a [tag, body] array")
    tag, body = raw
    if type(tag) is not int or tag not in table:
        raise ProtocolError(f"unknown {what} tag {tag!r}")
    if not isinstance(body, dict):
        raise ProtocolError(f"{what} body must be a map")
    return table[tag], body


@functools.cache
def _hints(cls: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def _from_wire_fields(cls: type, body: dict, path: str):
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in body:
            kwargs[f.name] = _from_wire(hints[f.name], body[f.name], f"{path}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{path}: missing field {f.name!r}")
    return cls(**kwargs)


def _from_wire(annotation, value, path: str):
    """Check `value` against `annotation`, converting lists and maps to their Python types."""
    if annotation is KVEvent:  # a tagged union, unlike the `X | None` unions
        cls, body = _tagged(value, KV_EVENT_TYPES, f"{path} event")
        return _from_wire_fields(cls, body, f"{path}.{cls.__name__}")
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return _from_wire_union(typing.get_args(annotation), value, path)
    if origin is tuple:
        if not isinstance(value, list):
            raise ProtocolError(f"{path}: expected an array, got {type(value).__name__}")
        return tuple(_from_wire(typing.get_args(annotation)[0], v, path) for v in value)
    if origin is dict:  # of strings (a trace context)
        if isinstance(value, dict) and all(type(x) is str for kv in value.items() for x in kv):
            return value
        raise ProtocolError(f"{path}: expected a map of strings")
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ProtocolError(f"{path}: expected a map, got {type(value).__name__}")
        return _from_wire_fields(annotation, value, path)
    return _scalar(annotation, value, path)


def _from_wire_union(options: tuple, value, path: str):
    if value is None:
        if type(None) in options:
            return None
        raise ProtocolError(f"{path}: must not be null")
    (inner,) = [o for o in options if o is not type(None)]  # only `X | None` is used
    return _from_wire(inner, value, path)


def _scalar(annotation, value, path: str):
    if annotation is float and type(value) in (int, float):
        return float(value)
    if annotation in (int, str, bool) and type(value) is annotation:
        return value
    expected = getattr(annotation, "__name__", str(annotation))
    raise ProtocolError(f"{path}: expected {expected}, got {type(value).__name__}")
