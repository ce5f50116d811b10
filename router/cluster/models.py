"""The models a router serves: one tokenizer, prefix index and dispatcher (worker set) each.

A request names its model in `model` (its id or an alias); a worker names the model it serves
when it registers. Requests go only to workers of their model, and each model's prefix index
holds only its workers' blocks (two models' KV for the same tokens differ, even when their
tokenizers hash them alike).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.errors import ApiError, bad_request

if TYPE_CHECKING:
    from router.config import ModelSpec
    from router.metrics.router_metrics import ModelMetrics
    from router.routing.dispatcher import Dispatcher
    from router.routing.embed_jobs import EmbedDispatcher
    from router.routing.prefix_index import PrefixIndex
    from router.text.tokenizer import ModelTokenizer
    from shared.models.embedding import EmbeddingSpec


@dataclass(eq=False)
class ServedModel:
    spec: ModelSpec
    tokenizer: ModelTokenizer
    index: PrefixIndex
    dispatcher: Dispatcher
    metrics: ModelMetrics
    # an embedding model (shared/models/embedding.py): how it pools, and its jobs; None: chat
    embedding: EmbeddingSpec | None = None
    embed_jobs: EmbedDispatcher | None = None

    @property
    def id(self) -> str:
        return self.spec.served_id


class ModelTable:
    """The served models by id and alias; the first is the default."""

    def __init__(self, models: Sequence[ServedModel]):
        self._models = list(models)
        self._by_name = {name: m for m in self._models for name in m.spec.names}

    def get(self, name: str) -> ServedModel | None:
        return self._by_name.get(name)

    def __getitem__(self, name: str) -> ServedModel:
        return self._by_name[name]

    @property
    def default(self) -> ServedModel:
        return self._models[0]

    @property
    def ids(self) -> list[str]:
        return [m.id for m in self._models]

    def for_request(self, body: dict) -> ServedModel:
        """The model a request body names; 400 without a name, 404 naming those served."""
        name = body.get("model")
        if not isinstance(name, str):
            raise bad_request("'model' is required and must be a string", "model")
        model = self._by_name.get(name)
        if model is None:
            raise unknown_model(name, self.ids)
        return model

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)


def unknown_model(name: str, served: Sequence[str]) -> ApiError:
    listed = ", ".join(f"'{s}'" for s in served)
    return ApiError(
        404,
        f"The model '{name}' does not exist; this router serves {listed} (GET /v1/models "
        "lists them with their aliases)",
        "model",
        "model_not_found",
    )
