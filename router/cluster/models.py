"""The models a router serves, looked up by id or alias; what the cluster needs of each.

A request names its model in `model` (its id or an alias); a worker names the model it serves
when it registers. Requests go only to workers of their model, and each model's prefix index
holds only its workers' blocks (two models' KV for the same tokens differ, even when their
tokenizers hash them alike).

The table holds whatever the layer above serves (router.routing.models.ServedModel: tokenizer,
index, dispatcher); the cluster reads of a model only what `ClusterModel` says: its id and
names, whether it embeds, and the index its workers' KV events feed (`WorkerKV`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from router.errors import ApiError, bad_request

if TYPE_CHECKING:
    from router.config import ModelSpec
    from shared.kv_events import KVEvent
    from shared.models.embedding import EmbeddingSpec


class WorkerKV(Protocol):
    """The KV blocks a model's workers hold, fed by their events (router.routing's
    PrefixIndex is one). Every method mutates, but `num_blocks`."""

    def apply(self, worker_id: str, event: KVEvent) -> None: ...

    def receive_inventory(
        self,
        worker_id: str,
        part: int,
        parts: int,
        block_hashes: Iterable[int],
        windowless: Iterable[int] = (),
        snapshots: Iterable[int] = (),
    ) -> bool:
        """Part `part` of `parts` of the worker's inventory; True once the last is in."""

    def set_window(self, worker_id: str, blocks: int, chunk_blocks: int = 0) -> None: ...

    def set_snapshots(self, worker_id: str, hybrid: bool) -> None: ...

    def drop_worker(self, worker_id: str) -> None: ...

    def purge_expired(self) -> int: ...

    def num_blocks(self, worker_id: str) -> int: ...


class ClusterModel(Protocol):
    """What the cluster reads of a served model."""

    spec: ModelSpec
    embedding: EmbeddingSpec | None  # an embedding model: how it pools; None: chat

    @property
    def index(self) -> WorkerKV: ...

    @property
    def id(self) -> str: ...


M = TypeVar("M", bound=ClusterModel)


class ModelTable(Generic[M]):
    """The served models by id and alias; the first is the default."""

    def __init__(self, models: Sequence[M]):
        self._models = list(models)
        self._by_name = {name: m for m in self._models for name in m.spec.names}

    def get(self, name: str) -> M | None:
        return self._by_name.get(name)

    def __getitem__(self, name: str) -> M:
        return self._by_name[name]

    @property
    def default(self) -> M:
        return self._models[0]

    @property
    def ids(self) -> list[str]:
        return [m.id for m in self._models]

    def for_request(self, body: dict) -> M:
        """The model a request body names; 400 without a name, 404 naming those served."""
        name = body.get("model")
        if not isinstance(name, str):
            raise bad_request("'model' is required and must be a string", "model")
        model = self._by_name.get(name)
        if model is None:
            raise unknown_model(name, self.ids)
        return model

    def __iter__(self) -> Iterator[M]:
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
