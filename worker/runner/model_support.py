"""Which mlx-lm models the paged engine serves, and how each layer reads its K/V.

At load (the engine's `check_model`): `probe_shape` reads the model's cache kinds
and K/V shapes off a one-token forward under mlx-lm (refusing, in one sentence, caches the
paged KV cannot stand in for: `worker.runner.layer_groups`); then a one-token forward of ours
with every layer in the gathered mode tells, per layer, whether it may take the paged fast
path (`decide_modes`); then, for an architecture the tests do not cover, a greedy comparison
with plain mlx-lm on one prompt (`reference_greedy`) must match or the model is refused.

Architectures in `COVERED_ARCHITECTURES` are those whose greedy-equality tests skip the
load-time comparison (tests/unit/worker/engine/test_engine.py and the architecture sweep).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from worker.runner.layer_cache import KEYS_ONLY_V, CacheEntries, CacheLayout
from worker.runner.layer_groups import (
    CHUNK,
    FULL,
    STATE,
    WINDOW,
    LayerKind,
    UnsupportedModel,
    entry_sizes,
    layer_kinds,
    model_type,
)
from worker.state import StateShape

COVERED_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
STATE_PROBE_TOKENS = 16  # the second sizing forward of a model with recurrent states

__all__ = ["LayerKind", "ModelShape", "UnsupportedModel", "model_type", "probe_shape"]

KVShape = tuple[int, int, int, int]  # K heads, K width, V heads, V width


@dataclass(frozen=True)
class ModelShape:
    num_layers: int  # cache slots (layers that keep K/V; KV-shared layers hold none)
    num_kv_heads: int  # of the first layer
    head_dim: int  # of the first layer's K
    kv_dtype: mx.Dtype
    vocab_size: int
    num_heads: int = 0  # query heads (0: unknown)
    layer_kinds: tuple[LayerKind, ...] = ()  # per cache slot (empty: all full attention)
    layer_shapes: tuple[KVShape, ...] = ()  # per cache slot (empty: all the first's)
    # recurrent layers (hybrid models): each one's state arrays, per sequence
    states: tuple[StateShape, ...] = ()
    # per mlx-lm cache slot (CacheLists opened), in order: K/V layer k >= 0, or state -1 - s
    # (empty: every slot a K/V layer); and how many slots each cache entry is, and which
    # entries are CacheLists (empty: no entry is: one slot each)
    slot_map: tuple[int, ...] = ()
    entry_sizes: tuple[int, ...] = ()
    entry_lists: tuple[bool, ...] = ()  # per cache entry: a CacheList (empty: none is)
    # K/V slots whose values are their keys (an indexer's `update_and_fetch(k, k)`): the
    # pool keeps no second copy of them (`pool_shapes`)
    keys_only: tuple[int, ...] = ()

    def kinds(self) -> list[LayerKind]:
        return list(self.layer_kinds) or [LayerKind()] * self.num_layers

    def shapes(self) -> list[KVShape]:
        first = (self.num_kv_heads, self.head_dim, self.num_kv_heads, self.head_dim)
        return list(self.layer_shapes) or [first] * self.num_layers

    def pool_shapes(self, quantized: bool) -> list[KVShape]:
        """Each slot's K/V shape in the pool: a keys-only slot's V one value wide, never
        written or read (`LayerCache`; quantized pools keep it whole: groups of 32+)."""
        if quantized:
            return self.shapes()
        return [
            (h, d, *KEYS_ONLY_V) if i in self.keys_only else (h, d, hv, dv)
            for i, (h, d, hv, dv) in enumerate(self.shapes())
        ]

    def gathered(self) -> list[bool]:
        """Each cache slot's mode before the load-time probe refines it: windows and K/V of
        two shapes gathered, the rest paged."""
        return [
            kind.kind != FULL or (h, d) != (hv, dv)
            for kind, (h, d, hv, dv) in zip(self.kinds(), self.shapes(), strict=True)
        ]

    def layout(self) -> CacheLayout:
        """The cache slots a runner is made with: each one's kind, its first mode
        (`gathered`; the load-time probe settles the modes) and where it sits among mlx-lm's
        cache entries (a CacheList entry is several: `entry_lists`)."""
        entries = CacheEntries(self.slot_map, self.entry_sizes, self.entry_lists)
        return CacheLayout(tuple(self.kinds()), tuple(self.gathered()), entries)

    @property
    def recurrent(self) -> bool:
        return bool(self.states)

    @property
    def uniform(self) -> bool:
        """Every layer's K and V of one shape (what the disk tier, transfers and the
        tensor-parallel split assume)."""
        shapes = self.shapes()
        return len(set(shapes)) == 1 and all((h, d) == (hv, dv) for h, d, hv, dv in shapes)

    def kv_bytes_per_token(self, itemsize: int | None = None) -> int:
        size = itemsize or self.kv_dtype.size
        return sum(h * d + hv * dv for h, d, hv, dv in self.shapes()) * size


def probe_shape(model: nn.Module) -> ModelShape:
    """Cache slots, their kinds and K/V shapes and dtype, read off a one-token forward with
    mlx-lm's own caches; refuses (UnsupportedModel, one sentence) a model with a cache the
    paged KV cannot stand in for (`worker.runner.layer_groups.layer_kinds`)."""
    from mlx_lm.models.cache import CacheList, make_prompt_cache

    cache = make_prompt_cache(model)
    flat = layer_kinds(model, cache)
    aliased = _watch_aliasing(cache, flat)
    try:
        logits = model(mx.array([[0]]), cache=cache)
        if any(k.kind == STATE for k in flat):
            # a state that grows to its size over the first tokens (LongCat's n-gram
            # context: the last n - 1 ids) is sized once it is full
            model(mx.zeros((1, STATE_PROBE_TOKENS), dtype=mx.int32), cache=cache)
    except Exception as exc:  # noqa: BLE001 - any failure of a plain forward is a refusal
        raise UnsupportedModel(
            f"model type {model_type(model)!r} failed a one-token forward under mlx-lm "
            f"itself ({type(exc).__name__}: {exc})"
        ) from exc
    members = [m for c in cache for m in (c.caches if hasattr(c, "caches") else [c])]
    kv = [c for c, k in zip(members, flat, strict=True) if k.kind != STATE]
    kinds = tuple(k for k in flat if k.kind != STATE)
    shapes = tuple(
        (c.keys.shape[1], c.keys.shape[3], c.values.shape[1], c.values.shape[3]) for c in kv
    )
    if any(0 in shape for shape in shapes):  # MLX's scatter into it stops the process
        raise UnsupportedModel(
            f"model type {model_type(model)!r} has a layer that caches keys or values of "
            "width 0, which the paged KV's pool cannot hold"
        )
    states = tuple(
        _state_shape(model, c) for c, k in zip(members, flat, strict=True) if k.kind == STATE
    )
    slot_map, counts = [], {True: 0, False: 0}
    for k in flat:
        state = k.kind == STATE
        slot_map.append(-1 - counts[True] if state else counts[False])
        counts[state] += 1
    lists = tuple(isinstance(c, CacheList) for c in cache)
    keys_only = tuple(i for i, c in enumerate(kv) if id(c) in aliased)
    first = shapes[0] if shapes else (1, 1, 1, 1)
    dtype = kv[0].keys.dtype if kv else states[0][0][1]
    heads = getattr(getattr(model, "args", None), "num_attention_heads", 0) or first[0]
    if not isinstance(heads, int):
        heads = first[0]
    return ModelShape(
        len(kv),
        first[0],
        first[1],
        dtype,
        logits.shape[-1],
        int(heads),
        kinds,
        shapes,
        states,
        tuple(slot_map) if states else (),
        tuple(entry_sizes(cache)) if any(lists) else (),
        lists if any(lists) else (),
        keys_only,
    )


def _watch_aliasing(cache: list, kinds: list[LayerKind]) -> set[int]:
    """Mutates `cache`'s K/V caches (`kinds`: each member's) to note, by id, each one handed
    its keys as its values; returns that set, filled as the probe's forward runs."""
    seen: set[int] = set()
    members = [m for c in cache for m in (c.caches if hasattr(c, "caches") else [c])]
    for c, kind in zip(members, kinds, strict=True):
        if kind.kind != STATE:

            def watched(keys, values, _c=c, _inner=c.update_and_fetch):
                if values is keys:
                    seen.add(id(_c))
                return _inner(keys, values)

            c.update_and_fetch = watched
    return seen


def _state_shape(model: nn.Module, c) -> StateShape:
    """A recurrent layer's state arrays, per sequence, as one mlx-lm forward left them."""
    if any(a is None for a in c.cache):
        raise UnsupportedModel(
            f"model type {model_type(model)!r} has a recurrent layer that leaves part of its "
            "state unset after a forward, which the state pool cannot size"
        )
    return tuple((tuple(a.shape[1:]), a.dtype) for a in c.cache)


def decide_modes(
    model: nn.Module, kinds: list[LayerKind], caches: list, uncached_attention: int = 0
) -> list[bool]:
    """After a one-token forward of ours with every layer gathered (`caches` its layer
    caches): per cache slot, True where the layer must stay gathered, False where the paged
    attention plan can serve it (full or windowed attention through the hook, once, with a
    mask of ours or none and the K/V its cache fetched, sinks or not, K and V of one shape;
    never a chunked layer). Raises UnsupportedModel where a layer never wrote its K/V through
    the cache, asked for a window wider than its cache keeps, or is chunked and did not attend
    through the hook once (its chunk mask would be the model's own)."""
    name = model_type(model)
    wrote = sum(c.writes == 1 for c in caches)
    if wrote != len(caches):
        raise UnsupportedModel(
            f"model type {name!r}: {wrote} of {len(caches)} layers wrote their K/V through "
            "the cache once; its attention bypasses the paged-KV seam"
        )
    # a layer attending twice, or with another group's mask, may be reading another layer's
    # K/V (iquestloopcoder's second loop): then which layers' K/V travel is unknown
    passed_along = uncached_attention > 0 or any(
        c.attends > 1 or not all(ours for ours, _, _ in c.attended) for c in caches
    )
    gathered = []
    for kind, c in zip(kinds, caches, strict=True):
        asked = set(c.window_sizes)
        if kind.window is not None and any(w > kind.window for w in asked):
            raise UnsupportedModel(
                f"model type {name!r} asks a window of {max(asked)} of a layer whose cache "
                f"keeps {kind.window} keys"
            )
        if kind.kind == CHUNK and c.attends != 1:
            raise UnsupportedModel(
                f"model type {name!r} has a chunked-attention layer that attends outside "
                "mlx-lm's scaled_dot_product_attention, where its chunk mask cannot be ours"
            )
        (k_heads, k_dim), (v_heads, v_dim) = c.shapes
        paged = kind.kind != CHUNK and (
            asked <= ({kind.window} if kind.kind == WINDOW else set())
            and c.attends == 1
            and [(ours, same) for ours, _, same in c.attended] == [(True, True)]
            and (k_heads, k_dim) == (v_heads, v_dim)
            and c.shared_reads == 0
            and not passed_along
        )
        gathered.append(not paged)
    return gathered


def reference_greedy(model: nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    """Plain mlx-lm greedy decoding of `prompt` (the load-time comparison's reference)."""
    from mlx_lm.generate import generate_step

    out = []
    for token, _ in generate_step(
        mx.array(prompt), model, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, axis=-1)
    ):
        out.append(int(token))
    return out


def verification_prompt(vocab_size: int, length: int, salt: int = 13) -> list[int]:
    """A fixed prompt of `length` ids spread over the vocabulary (no tokenizer needed)."""
    return [(7919 * i + salt) % vocab_size for i in range(length)]
