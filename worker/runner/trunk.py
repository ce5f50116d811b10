"""The two halves of an mlx-lm causal LM as our forwards use them: the trunk and the head.

The trunk is the module that owns the decoder layers and takes `(inputs, cache)`: whatever
it is called (`model.model`, `model.transformer`, a vision wrapper's
`model.language_model.model`), it is found by what it is, the first module, breadth first,
holding a list of layers. The head is everything the model's own `__call__` does after the
trunk (the output projection, tied or not, and any final soft-capping or logit scale): it is
run by calling the model itself with the trunk stood in for by a module that returns the
hidden states given, so a model's own head code runs unchanged and only at the positions that
sample (projecting every prefill position onto the vocabulary is wasted work).

A model whose layers sit on the top module itself has no separate trunk: the whole model runs
and its logits are the "hidden states" (the head is then the identity).
"""

from __future__ import annotations

import functools
import inspect

import mlx.core as mx
import mlx.nn as nn

from worker.runner.row_ranges import install_row_ranges


def _has_layers(module: nn.Module) -> bool:
    """Holds its layers itself (a module's own list, not a property reaching into a child)."""
    for name in ("layers", "h"):
        layers = module.get(name)
        if isinstance(layers, list) and layers and isinstance(layers[0], nn.Module):
            return True
    return False


def _takes_cache(module: nn.Module) -> bool:
    if not callable(module):
        return False
    return "cache" in inspect.signature(type(module).__call__).parameters


def find_trunk(model: nn.Module) -> tuple[nn.Module, str] | None:
    """(owner, attribute) of the trunk: the outermost module below `model`, on the way to
    the one holding the layers, whose call takes a `cache` (a container of layers that is not
    called itself is skipped, as is anything below the module the model calls)."""
    queue: list[tuple[nn.Module, list[tuple[nn.Module, str]]]] = [(model, [])]
    while queue:
        owner, path = queue.pop(0)
        for name, child in owner.children().items():
            if not isinstance(child, nn.Module):
                continue
            here = [*path, (owner, name)]
            if _has_layers(child):
                callers = [(o, n) for o, n in here if _takes_cache(getattr(o, n))]
                return callers[0] if callers else here[-1]
            queue.append((child, here))
    return None


class _Given(nn.Module):
    """Stands in for the trunk while the head runs: returns the hidden states it was given;
    any attribute the head reads of the trunk (a tied embedding) is the trunk's."""

    def __init__(self, trunk: nn.Module, hidden: mx.array):
        super().__init__()
        self._given = (trunk, hidden)  # a tuple: not a child module or parameter

    def __call__(self, *args, **kwargs) -> mx.array:
        return self._given[1]

    def __getattr__(self, name: str):
        if name == "_given":
            return super().__getattr__(name)
        return getattr(self._given[0], name)


class Trunk:
    """`forward(tokens, caches)` -> hidden states (B, L, hidden); `head(h)` -> logits."""

    def __init__(self, model: nn.Module):
        self.model = model
        install_row_ranges(model)  # (Llama 4's ranges over `cache.offset`)
        found = find_trunk(model)
        self.owner, self.attribute = found if found is not None else (None, "")
        module = getattr(self.owner, self.attribute) if self.owner is not None else model
        self.module = module
        params = inspect.signature(type(module).__call__).parameters
        self._cache_keyword = "cache" in params
        mask = params.get("mask")  # a trunk that takes the mask from its model (phixtral)
        self._needs_mask = mask is not None and mask.default is inspect.Parameter.empty

    def forward(
        self, tokens: mx.array, caches: list, embeddings: mx.array | None = None
    ) -> mx.array:
        """`embeddings` (B, L, hidden), when given, stand for the tokens' own (images)."""
        if embeddings is not None:
            return self.module(tokens, cache=caches, input_embeddings=embeddings)
        if self._needs_mask:
            mask = caches[0].make_mask(tokens.shape[1])
            return self.module(tokens, mask, caches)
        if self._cache_keyword:
            return self.module(tokens, cache=caches)
        return self.module(tokens, caches)

    @functools.cached_property
    def embedding(self) -> nn.Module:
        """The token embedding the trunk uses (`embed_tokens`, breadth first below it; found
        once, not on every forward that embeds images)."""
        queue = [self.module]
        while queue:
            module = queue.pop(0)
            if isinstance(found := module.get("embed_tokens"), nn.Module):
                return found
            queue.extend(c for c in module.children().values() if isinstance(c, nn.Module))
        raise AttributeError("the model has no embed_tokens")

    def embed(self, tokens: mx.array) -> mx.array:
        return self.embedding(tokens)

    def head(self, hidden: mx.array) -> mx.array:
        """Logits of hidden states `(n, hidden)` -> `(n, vocab)`."""
        if self.owner is None:
            return hidden
        trunk = getattr(self.owner, self.attribute)
        setattr(self.owner, self.attribute, _Given(trunk, hidden[None]))
        try:
            dummy = mx.zeros((1, hidden.shape[0]), dtype=mx.int32)
            logits = self.model(dummy, cache=None)
        finally:
            setattr(self.owner, self.attribute, trunk)
        return logits[0]
