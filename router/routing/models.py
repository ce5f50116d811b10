"""A model this router serves: its tokenizer, prefix index, dispatcher (its requests in
flight, generations or embeddings) and metrics. The table of them, by id and alias, is
router.cluster.models.ModelTable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.config import ModelSpec
    from router.metrics.router_metrics import ModelMetrics
    from router.routing.dispatcher import Dispatcher
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
    # an embedding model (shared/models/embedding.py): how it pools; None: a chat model
    embedding: EmbeddingSpec | None = None

    @property
    def id(self) -> str:
        return self.spec.served_id
