"""Where a router's SQLite store lives when no path is set: one file per router, named by its
HTTP port, so several routers on one machine never share (and lock) one file."""

from __future__ import annotations

import os
from pathlib import Path


def default_store_path(port: int, environ: dict[str, str] | None = None) -> Path:
    """$XDG_CACHE_HOME/mlx-fleet/responses-PORT.sqlite3 (~/.cache when XDG_CACHE_HOME is
    unset or not absolute, as the XDG spec says)."""
    env = os.environ if environ is None else environ
    cache = env.get("XDG_CACHE_HOME", "")
    root = Path(cache) if os.path.isabs(cache) else Path("~/.cache").expanduser()
    return root / "mlx-fleet" / f"responses-{port}.sqlite3"
