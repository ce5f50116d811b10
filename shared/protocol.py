"""The router <-> worker wire protocol: typed messages in msgpack frames.

Frames as shared/wire.py makes them: `[tag, body]`, `tag` from MESSAGE_TYPES; KV events inside
KVEvents are `[event_tag, body]` (KV_EVENT_TYPES). A frame that is not a valid message raises
ProtocolError, which a receiver logs and drops. PROTOCOL_VERSION is checked once, at registration.

Sockets: the router binds a ZeroMQ ROUTER socket; each worker connects one DEALER socket and
sends single-frame messages; Register first, then it waits for RegisterAck."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    BlockWindowsDropped,
    KVEvent,
    StateSnapshotsDropped,
    StateSnapshotsStored,
)
from shared.kv_events import KVEvents as KVEvents  # the messages of the KV channel
from shared.kv_events import KVInventory as KVInventory
from shared.kv_events import SendInventory as SendInventory
from shared.placement.messages import HOST_MESSAGE_TYPES
from shared.sampling import SamplingParams
from shared.wire import Codec
from shared.wire import ProtocolError as ProtocolError  # raised by decode

# 2: logit processing, top_logprobs; 3: prompt_logprobs, min_tokens (older workers: refused)
PROTOCOL_VERSION = 3
MAX_FRAME_BYTES = 64 * 1024 * 1024
# ---------------------------------------------------------------- worker -> router


@dataclass(frozen=True, slots=True)
class KVGroupReport:
    """One layer group of a worker's KV pool: the cache kind its layers keep, how many layers,
    what a token costs in them, and how many of them the paged attention plan reads (the
    rest gather their visible K/V for the model's own attention code)."""

    kind: str  # "full attention", "sliding window 512"
    layers: int
    bytes_per_token: int
    paged_layers: int = 0


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
    kv_groups: tuple[KVGroupReport, ...] = ()  # the pool's layer groups (empty: unknown)


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
    # the fleet cache (issue 22): where peers fetch this worker's KV blocks ("": nowhere), and
    # its part: "both", "prefill" (computes prompts' K/V for decode workers to pull), "decode"
    kv_endpoint: str = ""
    role: str = "both"
    # the worker's hit rule (shared/prefix/hit_rule.py), which the router applies too: a hit
    # needs the window pages of the `window_blocks` before its end (sliding windows), of those
    # from its chunk's start (chunked attention, chunks of `chunk_blocks`); one that ends only
    # at a snapshot of the states (hybrids, `StateSnapshotsStored`). 0, False: no such rule
    window_blocks: int = 0
    state_snapshots: bool = False
    chunk_blocks: int = 0
    # vision-language models: this worker takes images, or why not (the router's 400 says it)
    vision: bool = False
    vision_note: str = ""
    task: str = "chat"  # or "embed" (it takes Embed): it must be its model's at the router


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
    decode_kv_shared_bytes_mean: float = 0.0  # ...with each shared prefix read once (sampled)
    prefill_chunk_p50_ms: float = 0.0
    kv_write_ms_p50: float = 0.0  # sampled steps, all layers
    attention_ms_p50: float = 0.0  # sampled steps, all layers
    decode_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    spec_drafted: int = 0  # speculative draft tokens proposed, since start
    spec_accepted: int = 0  # ...and accepted by the target model
    folded_tokens: int = 0  # prompt tokens folded into decode forwards (MIXED), since start
    folded_forwards: int = 0
    prefill_forwards: int = 0  # padded prefill forwards: a weight pass each
    prefill_padding_tokens: int = 0  # token slots those computed beyond their prompt tokens
    # memory MLX accounts for (the rest of the process's RSS is the host's: Python, libraries)
    mlx_active_mb: float = 0.0  # arrays alive: weights, the KV pool, the kept prefixes below
    mlx_cache_mb: float = 0.0  # freed buffers MLX keeps for reuse
    prefix_kv_mb: float = 0.0  # gathered prefix K/V kept across ticks (a bounded cache)
    busy_s: float = 0.0  # seconds spent in engine steps since start (idle = wall time - this)


@dataclass(frozen=True, slots=True)
class LinkRate:
    """What fetching KV blocks from one peer measured (a probe, then real transfers)."""

    peer_id: str
    bytes_per_s: float
    latency_s: float = 0.0  # one small round trip


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Load and cache state, every `heartbeat_interval_s` (from RegisterAck)."""

    worker_id: str
    running: int  # sequences in the running batch
    waiting: int  # queued, not yet prefilling
    free_blocks: int
    total_blocks: int
    cached_blocks: int  # full blocks in the prefix cache (held by a sequence or not)
    hit_tokens: int  # cumulative prompt tokens served from the prefix cache
    prompt_tokens: int = 0  # cumulative prompt tokens seen (hit rate = hit / prompt)
    phases: WorkerPhases | None = None
    # optional (an older worker leaves them 0): the router's view of KV pressure
    evictable_blocks: int = 0  # cached blocks no running request holds
    evicted_blocks: int = 0  # cumulative blocks the prefix cache evicted
    loop_turns: int = 0  # engine loop turns so far: busy and not rising = stuck; 0 = unknown
    kv_checks: int = 0  # KV pool and prefix cache integrity checks run while idle, since start
    kv_check_failures: int = 0  # ...that found a broken invariant
    # the fleet cache: measured link rates to peers, blocks pulled from them (cumulative),
    # pulls that fell back to recompute, and the measured prefill rate (tokens/s; 0: unknown)
    links: tuple[LinkRate, ...] = ()
    pulled_blocks: int = 0
    pull_failures: int = 0
    prefill_tokens_per_s: float = 0.0
    # partial blocks kept beside the full ones: free + held + cached + partial == total
    cached_partial_blocks: int = 0
    # hybrid models: state snapshots for prefix hits (bytes), slots, reply-end copies running
    state_snapshots: int = 0
    state_snapshot_bytes: int = 0
    state_slots: int = 0
    state_kept: int = 0
    pinned_blocks: int = 0  # blocks cache pins (Generate.pins) keep from LRU, and the pins
    pins: int = 0


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
class Embeddings:
    """An Embed's answer: a vector per input, in order, as float32 little-endian bytes (4
    bytes a value; floats in msgpack take 9), or an error."""

    request_id: str
    vectors: tuple[bytes, ...] = ()
    prompt_tokens: int = 0
    error: str | None = None


# ---------------------------------------------------------------- router -> worker


@dataclass(frozen=True, slots=True)
class Peer:
    """Another worker of the same model and KV layout, and where its KV blocks are fetched."""

    worker_id: str
    kv_endpoint: str


@dataclass(frozen=True, slots=True)
class RegisterAck:
    accepted: bool
    reason: str = ""  # why not, when not accepted
    protocol_version: int = PROTOCOL_VERSION
    heartbeat_interval_s: float = 1.0
    peers: tuple[Peer, ...] = ()  # to probe the links to (LinkRate in heartbeats)


@dataclass(frozen=True, slots=True)
class PullHint:
    """Fetch the prompt's first `num_blocks` full blocks (those not held here) from a peer
    before computing them; on any failure, compute them."""

    worker_id: str
    kv_endpoint: str
    num_blocks: int


@dataclass(frozen=True, slots=True)
class CachePin:
    """Keep the prompt's first `num_tokens` tokens (their full blocks) cached for `ttl_s`
    seconds after this request, whatever LRU says: an Anthropic `cache_control` breakpoint
    (5 minutes or 1 hour) or OpenAI's `prompt_cache_retention: "24h"`. A later request with
    the same pin renews it. The worker bounds all its pins to a share of its pool (oldest
    dropped first), so hints cannot starve it; an older worker ignores the field."""

    num_tokens: int
    ttl_s: float


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a prompt, in prompt order: its encoded file (PNG, JPEG, ...) and how many
    of the prompt's image keys (`shared.models.vision`) stand for it."""

    data: bytes
    tokens: int


@dataclass(frozen=True, slots=True)
class Generate:
    """Start a request. The worker answers with TokenDeltas, or one error delta."""

    request_id: str
    token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # choices from one prefill (the worker forks it), each with its index and finish delta
    n: int = 1
    trace_context: dict[str, str] | None = None  # W3C traceparent/tracestate (tracing on)
    pull: PullHint | None = None  # the fleet cache: the prefix is held by a peer
    # disaggregated prefill: compute and cache the prompt's full blocks, answer one delta
    # (finish_reason "prefilled", no tokens) and keep them for the decode worker's pull
    prefill_only: bool = False
    # images: `token_ids` hold image keys where their tokens go, `images` their files
    images: tuple[ImageInput, ...] = ()
    # the scheduler's class: INTERACTIVE work is admitted first, BATCH work preempted first
    # (an older worker ignores the field: every request is then interactive)
    priority: int = 0
    # prefixes to keep cached past this request (cache_control, prompt_cache_retention)
    pins: tuple[CachePin, ...] = ()


INTERACTIVE, BATCH = 0, 1  # Generate.priority


@dataclass(frozen=True, slots=True)
class Embed:
    """Embed each input (token ids); one Embeddings answers. `dimensions` (Matryoshka
    models): keep this many values of each vector, then normalize (0: all)."""

    request_id: str
    inputs: tuple[tuple[int, ...], ...]
    dimensions: int = 0


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
    | KVInventory
    | RegisterAck
    | Generate
    | Abort
    | Shutdown
    | ReRegister
    | SendInventory
    | Embed
    | Embeddings
)

# Tags are the wire contract: never renumber, only add.
MESSAGE_TYPES: dict[int, type] = {
    1: Register,
    2: Heartbeat,
    3: TokenDelta,
    4: KVEvents,
    5: KVInventory,  # an older router drops it (a logged ProtocolError) and works as before
    10: RegisterAck,
    11: Generate,
    12: Abort,
    13: Shutdown,
    14: ReRegister,
    15: SendInventory,
    16: Embed,  # only to workers registered with task "embed"
    17: Embeddings,
    **HOST_MESSAGE_TYPES,  # host agents (shared/placement/messages.py): 30-49
}
KV_EVENT_TYPES: dict[int, type] = {
    1: BlockStored,
    2: BlockRemoved,
    3: AllBlocksCleared,
    4: BlockWindowsDropped,
    5: StateSnapshotsStored,
    6: StateSnapshotsDropped,
}

_CODEC = Codec(MESSAGE_TYPES, {KVEvent: KV_EVENT_TYPES}, MAX_FRAME_BYTES)
encode = _CODEC.encode  # one message as a msgpack frame
decode = _CODEC.decode  # one frame as a message; ProtocolError on anything else
