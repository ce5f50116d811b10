"""Layer groups: the model's layers grouped by the kind of K/V cache each keeps.

Read off the model at load from the caches mlx-lm itself would make (`make_prompt_cache`):
a `KVCache` is full causal attention, a `RotatingKVCache(max_size=W)` a sliding window of W
keys (each query sees itself and the W - 1 positions before it: mlx-lm's
`create_causal_mask(window_size=W)`), a `ChunkedKVCache(C)` chunked local attention (Llama 4:
a query at p sees the keys from ⌊p / C⌋·C to p, its own chunk's). Every group shares the
pool's pages and block hashes; a windowed or chunked group reads only the keys its queries can
see (`GroupSpan`). A chunk's keys all lie within the last C positions, so a chunked layer keeps
them as a window of C does (`window` C: window pages, released once every holder is past them)
and differs only in its mask.

An `ArraysCache` is a recurrent layer's state (linear attention, state space, short
convolution: `STATE`), kept per sequence in the state pool (`worker.state`) rather than in
pages. A `CacheList` is opened into its members, each a slot of its own: a state and an
attention cache (Falcon-H1's parallel mixer and attention), or two attention caches (DeepSeek
V3.2's indexer keys beside MLA's latent, LongCat-Flash's two attention blocks), every member
gathering the same span of positions. Anything else is refused at load with one sentence that
says what it uses and what to do instead: a window that keeps its first tokens, an indexer that places queries by the batch's K/V length.

Two ways a layer reads its K/V (`LayerCache`, `worker.runner.layer_cache`):
- **paged**: full attention through `mlx_lm.models.base.scaled_dot_product_attention`, with
  K and V of one shape and no sinks: the paged-attention plan reads the pool directly (the
  fast paths: tiles, shared prefixes, the Metal kernel);
- **gathered**: everything else (windows, chunks, sinks, MLA's latent "keys" and rope "values" of
  different widths, soft-capping models that compute attention themselves, KV-shared layers):
  the layer's cache gathers each row's visible span of K/V from the pool and hands the model
  that dense K/V and a boolean mask of causality, window (or chunk) and lengths, so the
  model's own attention code runs unchanged (no forked model files).
The load-time probe (the engine's `check_model`, at start-up) decides per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

FULL, WINDOW, CHUNK, STATE = "full", "window", "chunk", "state"


class UnsupportedModel(ValueError):
    """This model cannot be served over the paged KV; the message says why."""


@dataclass(frozen=True)
class LayerKind:
    """What one cache slot of the model keeps: full attention, a window of `window` keys,
    chunks of `window` keys (CHUNK: a query sees its own chunk's keys, at most the last
    `window`), or a recurrent state."""

    kind: str = FULL
    window: int | None = None

    @property
    def chunk(self) -> int | None:
        """The chunk size of chunked local attention (None for every other kind)."""
        return self.window if self.kind == CHUNK else None

    def describe(self) -> str:
        if self.kind == STATE:
            return "recurrent state"
        if self.kind == CHUNK:
            return f"chunked local attention {self.window}"
        return "full attention" if self.kind == FULL else f"sliding window {self.window}"


@dataclass(frozen=True)
class LayerGroup:
    kind: LayerKind
    layers: tuple[int, ...]


def model_type(model: nn.Module) -> str:
    args = getattr(model, "args", None)
    return getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]


def _refusal(name: str, uses: str, instead: str) -> UnsupportedModel:
    return UnsupportedModel(
        f"model type {name!r} is not served: it uses {uses}, which the paged KV does not "
        f"implement yet; {instead}"
    )


_INSTEAD = "serve it with mlx_lm.server meanwhile"


# Architectures whose forward assumes one position for the whole batch: found by the
# architecture sweep (tests/unit/worker/engine/test_every_architecture.py); a one-prompt check
# at load cannot see it. mlx-lm's own batched generation shares the limitation.
ONE_POSITION_PER_BATCH = {
    "afm7": "KV-reuse layers that take their queries' positions from the K/V length",
    "gpt_bigcode": "position embeddings indexed by one number for the whole batch",
}


# Architectures whose forward crashes MLX's CPU back-end (a fatal signal, not an exception):
# refused before the first forward where there is no Metal.
CPU_CRASHES = {"phi3small": "a forward that crashes MLX's CPU back-end (mlx 0.32)"}


# Architectures whose sparse-attention indexer (the second cache of a layer's CacheList)
# places every row's queries at the end of the batch's keys: refused only where a layer has
# that indexer (a config without sparse layers is served).
INDEXER_ONE_POSITION = {
    "minimax_m3_vl": "a sparse-attention indexer that places every row's queries at the end "
    "of the batch's keys (its local blocks), so sequences at different positions cannot "
    "share a batch",
}


def layer_kinds(model: nn.Module, caches: list) -> list[LayerKind]:
    """The kind of each of `caches` (mlx-lm's own, from `make_prompt_cache(model)`), a
    `CacheList` opened into its members (`entry_sizes` says how); raises UnsupportedModel, in
    one sentence, for a cache neither the paged KV nor the state pool can stand in for."""
    name = model_type(model)
    if name in CPU_CRASHES and not mx.metal.is_available():
        raise UnsupportedModel(
            f"model type {name!r} is not served on this machine: it has {CPU_CRASHES[name]}; "
            "serve it on a Mac (Metal)"
        )
    if name in ONE_POSITION_PER_BATCH:
        raise _refusal(
            name,
            ONE_POSITION_PER_BATCH[name] + ", so sequences at different positions cannot "
            "share a batch",
            _INSTEAD,
        )
    kinds = []
    for c in caches:
        members = _members(name, c)
        kinds.extend(_kind(name, m) for m in members)
    return kinds


def entry_sizes(caches: list) -> list[int]:
    """How many of `layer_kinds`' slots each cache entry is (a CacheList: its members)."""
    from mlx_lm.models import cache as mlx_cache

    return [len(c.caches) if isinstance(c, mlx_cache.CacheList) else 1 for c in caches]


def _members(name: str, c) -> list:
    from mlx_lm.models import cache as mlx_cache

    if not isinstance(c, mlx_cache.CacheList):
        return [c]
    states = sum(isinstance(m, mlx_cache.ArraysCache) for m in c.caches)
    if states > 1 or any(isinstance(m, mlx_cache.CacheList) for m in c.caches):
        raise _refusal(name, "a CacheList of two recurrent states or of CacheLists", _INSTEAD)
    if name in INDEXER_ONE_POSITION and len(c.caches) - states > 1:
        raise _refusal(name, INDEXER_ONE_POSITION[name], _INSTEAD)
    return list(c.caches)


def _kind(name: str, c) -> LayerKind:
    from mlx_lm.models import cache as mlx_cache

    kind = type(c).__name__
    if type(c) in (mlx_cache.KVCache, mlx_cache.ConcatenateKVCache):
        return LayerKind()
    if type(c) is mlx_cache.RotatingKVCache and c.keep == 0:
        return LayerKind(WINDOW, int(c.max_size))
    if type(c) is mlx_cache.RotatingKVCache:
        raise _refusal(name, f"a sliding window that keeps its first {c.keep} tokens", _INSTEAD)
    if isinstance(c, mlx_cache.ArraysCache):
        return LayerKind(STATE)
    if type(c) is mlx_cache.ChunkedKVCache:
        return LayerKind(CHUNK, int(c.chunk_size))
    raise _refusal(name, f"a cache of its own ({kind})", _INSTEAD)


def group_layers(kinds: list[LayerKind]) -> list[LayerGroup]:
    """Layers grouped by kind, in order of first appearance."""
    order: dict[LayerKind, list[int]] = {}
    for i, kind in enumerate(kinds):
        order.setdefault(kind, []).append(i)
    return [LayerGroup(kind, tuple(layers)) for kind, layers in order.items()]


# Models that compute attention themselves over scores laid out (B, KV heads, query heads per KV
# head, L, keys) when heads are grouped: their mask needs one more axis than mlx-lm's SDPA
# takes, (B, 1, 1, L, keys). A per-architecture fact, not something a one-row probe can see:
# a (B, 1, L, keys) mask broadcasts silently wrong against those scores when B equals the KV
# head count. Gemma 2 (logit soft-capping) is the one mlx-lm model served so.
GROUPED_SCORES = frozenset({"gemma2"})


def grouped_scores(model: nn.Module, trunk: nn.Module) -> bool:
    """Whether this model's layers attend over grouped-head scores (`GROUPED_SCORES`)."""
    if model_type(model) not in GROUPED_SCORES:
        return False
    layers = getattr(trunk, "layers", [])
    return any(getattr(getattr(x, "self_attn", None), "repeats", 1) > 1 for x in layers)


class GroupSpan:
    """The keys one forward's rows may see in a layer group, as slots to gather and a mask.

    Row b's queries are its last L positions of `context_lengths[b]`; with a window W the row
    needs only its last L + W - 1 keys (with chunks of W, those from its first query's chunk
    start on: at most as many), so every row gathers `width` keys from `starts[b]` on (the
    whole context without either). `mask` (B, 1, L, width) is True
    where a query may see a key: causal, inside the window (or the query's chunk, `chunk`),
    inside the row. Built from host ints once per group and forward; shared by the group's
    layers. Blocks before a row's start are never read, so a windowed group may release them
    (their table entries can point anywhere).
    """

    def __init__(
        self,
        block_tables: mx.array,
        context_lengths: list[int],
        num_queries: int,
        block_size: int,
        window: int | None,
        grouped: bool = False,
        masks_of: GroupSpan | None = None,
        chunk: bool = False,
    ):
        longest = max(context_lengths)
        width = longest if window is None else min(longest, num_queries + window - 1)
        if chunk and window is not None:  # from the chunk of each row's first query on
            width = max(c - (c - num_queries) // window * window for c in context_lengths)
        self.window, self.width, self.grouped = window, width, grouped
        self.chunk = window if chunk else None
        starts = mx.array([max(0, c - width) for c in context_lengths], dtype=mx.int32)
        key_pos = starts[:, None] + mx.arange(width, dtype=mx.int32)  # (B, width)
        blocks = mx.take_along_axis(block_tables, key_pos // block_size, axis=1)
        self.slots = blocks * block_size + key_pos % block_size
        ends = mx.array(context_lengths, dtype=mx.int32)
        query_pos = ends[:, None] - num_queries + mx.arange(num_queries, dtype=mx.int32)
        self.key_pos, self.query_pos = key_pos, query_pos
        # spans of one kind over other tables (window page sub-groups) share its mask objects:
        # the model makes one mask per kind and hands it to every layer of that kind
        own = (None, self.chunk) if chunk else (window, None)
        self._masks: dict[tuple[int | None, int | None], mx.array] = (
            masks_of._masks if masks_of is not None else {own: self.visible(*own)}
        )
        self.mask = self._masks[own]

    def visible(self, window: int | None, chunk: int | None = None) -> mx.array:
        rel = self.key_pos[:, None, :] - self.query_pos[:, :, None]  # (B, L, width)
        seen = rel <= 0
        if window is not None:
            seen = seen & (rel > -window)
        if chunk is not None:  # the query's own chunk: ⌊key / C⌋ == ⌊query / C⌋
            seen = seen & (self.key_pos[:, None, :] // chunk == self.query_pos[:, :, None] // chunk)
        return seen[:, None, None] if self.grouped else seen[:, None]

    def mask_for(self, window: int | None) -> mx.array:
        """The mask for a window asked of `make_mask` (a smaller one than the group's, or
        one asked of a full group: the full span holds every key it needs); a chunked group
        asked for none gets its chunk mask."""
        if window is None and self.chunk is not None:
            return self.mask
        key = (self.window if window is None else window, None)
        if key not in self._masks:
            self._masks[key] = self.visible(*key)
        return self._masks[key]

    def made_masks(self) -> list[mx.array]:
        return list(self._masks.values())
