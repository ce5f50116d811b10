"""The default store: a SQLite file per router, in WAL mode, owner-only, that a new router
reads back as it was left (count and bytes bounds included)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from router.store import backend_of, open_state
from router.store.paths import default_store_path
from router.store.sqlite import SqliteResponses
from shared.config.fields import ConfigError
from shared.config.fleet import parse_config
from tests.unit.router.store.test_response_stores import entry


async def test_entries_outlive_the_store_that_wrote_them(tmp_path, clock):
    path = tmp_path / "deep" / "responses.sqlite3"
    first = SqliteResponses(path, 3, 2**20, 3600.0, clock=clock)
    for i in range(4):
        clock.now += 1
        await first.put(entry(i, owner="key-a"))
    size = await first.total_bytes()
    # no close: a killed router never closes its file
    second = SqliteResponses(path, 3, 2**20, 3600.0, clock=clock)
    assert (await second.get("resp_3", "key-a")).context == entry(3).context
    assert await second.get("resp_3", "key-b") is None  # still its owner's alone
    assert await second.count() == 3 and await second.total_bytes() == size
    await second.put(entry(4, owner="key-a"))  # the bounds hold across the restart
    assert await second.count() == 3 and await second.get("resp_1", "key-a") is None
    assert second.journal_mode() == "wal"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # conversations: the owner's only
    await first.close()
    await second.close()


async def test_a_file_that_is_not_a_store_is_refused_in_one_sentence(tmp_path):
    path = tmp_path / "junk.sqlite3"
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(RuntimeError, match="not a responses store"):
        SqliteResponses(path, 10, 2**20, 60.0)


def test_each_router_gets_its_own_file_under_the_cache_folder(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert default_store_path(8000, env) == tmp_path / "mlx-fleet/responses-8000.sqlite3"
    assert default_store_path(8001, env) != default_store_path(8000, env)
    home = Path("~/.cache/mlx-fleet/responses-8000.sqlite3").expanduser()
    assert default_store_path(8000, {}) == home
    assert default_store_path(8000, {"XDG_CACHE_HOME": "relative"}) == home  # as XDG says


async def test_the_settings_pick_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    router = parse_config({"router": {"port": 8123}}).router
    assert backend_of(router) == "sqlite" and router.responses_store_ttl_s == 30 * 86400
    state = open_state(router)
    assert state.where == f"sqlite {tmp_path}/mlx-fleet/responses-8123.sqlite3"
    await state.close()
    chosen = parse_config({"router": {"responses_store": "memory"}}).router
    assert open_state(chosen).where == "memory"
    shared = parse_config({"router": {"state_url": "redis://127.0.0.1:1/0"}}).router
    assert backend_of(shared) == "redis"
    with pytest.raises(ConfigError, match="needs state_url"):
        backend_of(parse_config({"router": {"responses_store": "redis"}}).router)
    with pytest.raises(ConfigError, match="Redis URL"):
        parse_config({"router": {"state_url": "http://127.0.0.1:6379"}})
