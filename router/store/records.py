"""Files, batches and a batch's progress (router/api/batch/objects.py `Records`) in this
router's SQLite file or its memory.

The SQLite file sits beside the responses store (`responses-PORT.sqlite3` ->
`responses-PORT-batches.sqlite3`), WAL mode, synchronous=NORMAL like it: a record written is
kept across a SIGKILL. Files' content is a blob in the same file, so one path holds all of it
on the router's disk. Writes run in one thread of their own (a blob of tens of MB must not
stall the loop); reads inline.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS blobs (key TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, until REAL);
"""


def records_path(responses_path: Path) -> Path:
    return responses_path.with_name(f"{responses_path.stem}-batches{responses_path.suffix}")


class MemoryRecords:
    """This process's memory (`responses_store = "memory"`): a restart forgets them."""

    def __init__(self):
        self._records: dict[str, dict[str, str]] = {}
        self._blobs: dict[str, bytes] = {}
        self._leases: dict[str, tuple[str, float]] = {}

    async def put(self, kind: str, key: str, value: dict) -> None:
        self._records.setdefault(kind, {})[key] = json.dumps(value)

    async def get(self, kind: str, key: str) -> dict | None:
        found = self._records.get(kind, {}).get(key)
        return json.loads(found) if found is not None else None

    async def values(self, kind: str) -> list[dict]:
        return [json.loads(v) for v in self._records.get(kind, {}).values()]

    async def count(self, kind: str) -> int:
        return len(self._records.get(kind, {}))

    async def delete(self, kind: str, key: str) -> bool:
        return self._records.get(kind, {}).pop(key, None) is not None

    async def drop(self, kind: str) -> None:
        self._records.pop(kind, None)

    async def put_blob(self, key: str, data: bytes) -> None:
        self._blobs[key] = data

    async def get_blob(self, key: str) -> bytes | None:
        return self._blobs.get(key)

    async def delete_blob(self, key: str) -> None:
        self._blobs.pop(key, None)

    async def claim(self, name: str, holder: str, ttl_s: float) -> bool:
        now = time.time()
        current = self._leases.get(name)
        if current is not None and current[0] != holder and current[1] > now:
            return False
        self._leases[name] = (holder, now + ttl_s)
        return True

    async def close(self) -> None:
        pass


class SqliteRecords:
    def __init__(self, path: Path):
        self.path = Path(path).expanduser()
        self._writer = _connect(self.path)  # the writer thread's
        self._db = _connect(self.path)  # the loop's, for reads
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="batch-store")

    async def put(self, kind: str, key: str, value: dict) -> None:
        sql = (
            "INSERT INTO records VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET value = excluded.value"
        )
        await self._write(sql, (kind, key, json.dumps(value)))

    async def get(self, kind: str, key: str) -> dict | None:
        sql = "SELECT value FROM records WHERE kind = ? AND key = ?"
        row = self._db.execute(sql, (kind, key)).fetchone()
        return json.loads(row[0]) if row is not None else None

    async def values(self, kind: str) -> list[dict]:
        rows = self._db.execute("SELECT value FROM records WHERE kind = ?", (kind,))
        return [json.loads(row[0]) for row in rows]

    async def count(self, kind: str) -> int:
        return self._db.execute("SELECT count(*) FROM records WHERE kind = ?", (kind,)).fetchone()[
            0
        ]

    async def delete(self, kind: str, key: str) -> bool:
        sql = "DELETE FROM records WHERE kind = ? AND key = ?"
        return await self._write(sql, (kind, key)) > 0

    async def drop(self, kind: str) -> None:
        await self._write("DELETE FROM records WHERE kind = ?", (kind,))

    async def put_blob(self, key: str, data: bytes) -> None:
        await self._write("INSERT OR REPLACE INTO blobs VALUES (?, ?)", (key, data))

    async def get_blob(self, key: str) -> bytes | None:
        row = self._db.execute("SELECT data FROM blobs WHERE key = ?", (key,)).fetchone()
        return bytes(row[0]) if row is not None else None

    async def delete_blob(self, key: str) -> None:
        await self._write("DELETE FROM blobs WHERE key = ?", (key,))

    async def claim(self, name: str, holder: str, ttl_s: float) -> bool:
        now = time.time()
        sql = (
            "INSERT INTO leases VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET holder = "
            "excluded.holder, until = excluded.until WHERE leases.holder = excluded.holder "
            "OR leases.until < ?"
        )
        return await self._write(sql, (name, holder, now + ttl_s, now)) > 0

    async def close(self) -> None:
        self._thread.shutdown(wait=True)
        self._writer.close()
        self._db.close()

    async def _write(self, sql: str, args: tuple) -> int:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._run, sql, args)

    def _run(self, sql: str, args: tuple) -> int:
        """In the writer thread: one statement, one transaction; the rows it changed."""
        with self._writer:
            return self._writer.execute(sql, args).rowcount


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # the user's own: it holds prompts
    db = sqlite3.connect(path, isolation_level="IMMEDIATE", check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA busy_timeout = 5000")
        db.executescript(SCHEMA)
    except sqlite3.DatabaseError as e:
        db.close()
        raise RuntimeError(f"{path}: not a batch store this router can use ({e})") from None
    return db
