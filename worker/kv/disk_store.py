"""The KV tier on disk: blocks evicted from the prefix cache, kept as files, read back on a hit.

One file per block, named by its chained block hash, under a folder per model fingerprint:
`<root>/<fingerprint>/<hash:016x>.kv`. A file is a magic line, a JSON header (fingerprint,
block hash, parent hash, the block's token ids, dtype, shape, payload size and CRC-32) and the
payload: K then V of every layer, `(2, num_layers, block_size, num_kv_heads, head_dim)`; of a
quantized pool (`--kv-bits`), bytes `(2, num_layers, block_size, num_kv_heads, row_bytes)`, each
row a head vector's packed values, scales and biases (worker/kv/disk_tier.py).
Writes go through a background thread (write to a temporary name, then rename, so a crash
leaves no half file under a real name); the store is bounded by bytes, least recently used
files first. Reading checks the magic, header, fingerprint, size and checksum, and the token
ids against the prompt's: a corrupt, truncated or foreign file is deleted and counts as a
miss, never an error. A restarted worker finds its files again (`scan`) and announces them.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"MLXFLEETKV1\n"
MAX_HEADER_BYTES = 1 << 20


@dataclass(frozen=True)
class BlockLayout:
    """What every block of one worker's pool looks like on disk."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # numpy dtype name of the payload ("float32", "float16", "uint16" for bf16)
    # quantized K/V: e.g. "q8g64/float32" (bits, group size, scales' dtype), "" if not; then
    # `dtype` is "uint8" and each head vector is a row of `row_bytes`. Not in the repr, so the
    # fingerprints of unquantized layouts stay what they were (model_fingerprint adds it).
    quant: str = field(default="", repr=False)
    row_bytes: int = field(default=0, repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        last = self.row_bytes if self.quant else self.head_dim
        return (2, self.num_layers, self.block_size, self.num_kv_heads, last)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class StoredBlock:
    block_hash: int
    parent_hash: int
    token_ids: tuple[int, ...]
    size: int  # bytes on disk


class DiskKVStore:
    """Bounded, checksummed block files for one model fingerprint."""

    def __init__(self, root: Path, fingerprint: str, layout: BlockLayout, capacity_bytes: int):
        if capacity_bytes < 1:
            raise ValueError("the KV disk tier needs a capacity of at least one byte")
        self.dir = Path(root) / fingerprint
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fingerprint, self.layout, self.capacity = fingerprint, layout, capacity_bytes
        self._index: OrderedDict[int, StoredBlock] = OrderedDict()  # least recent first
        self._lock = threading.Lock()
        self._bytes = 0
        self._queue: queue.Queue = queue.Queue()
        self._pending: set[int] = set()
        self.removed: list[int] = []  # hashes dropped to stay in bounds, for KV events
        self.stats = {"written": 0, "read": 0, "rejected": 0, "dropped": 0}
        self._writer = threading.Thread(target=self._write_loop, daemon=True, name="kv-disk")
        self._writer.start()

    # ---- queries ----

    def __contains__(self, block_hash: int) -> bool:
        with self._lock:
            return block_hash in self._index or block_hash in self._pending

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def drain_removed(self) -> list[int]:
        """Hashes of the files dropped (to stay in bounds) since the last call."""
        with self._lock:
            removed, self.removed = self.removed, []
        return removed

    def hashes(self) -> set[int]:
        """Every block it holds or is writing (what the router may count on it)."""
        with self._lock:
            return set(self._index) | self._pending

    def blocks(self) -> list[StoredBlock]:
        """What is on disk, parents before their children where both are (for announcing)."""
        with self._lock:
            stored = list(self._index.values())
        known, ordered, seen = {b.block_hash: b for b in stored}, [], set()
        for block in stored:
            chain = []
            while block is not None and block.block_hash not in seen:
                chain.append(block)
                seen.add(block.block_hash)
                block = known.get(block.parent_hash)
            ordered += reversed(chain)
        return ordered

    # ---- writing ----

    def put(self, block_hash: int, parent_hash: int, token_ids, payload) -> None:
        """Queue a block for writing (a no-op if it is there or queued). `payload`: an array
        of `layout.shape` (numpy, or anything `np.asarray` takes) that no one changes after."""
        with self._lock:
            if block_hash in self._index or block_hash in self._pending:
                return
            self._pending.add(block_hash)
        self._queue.put((block_hash, parent_hash, tuple(token_ids), payload))

    def flush(self) -> None:
        """Wait until every queued write is on disk."""
        self._queue.join()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._writer.join(timeout=5)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except Exception:
                log.exception("could not write a KV block to %s", self.dir)
            finally:
                if item is not None:
                    with self._lock:
                        self._pending.discard(item[0])
                self._queue.task_done()

    def _write(self, block_hash: int, parent_hash: int, token_ids, payload) -> None:
        data = np.ascontiguousarray(np.asarray(payload).view(self.layout.dtype)).tobytes()
        if len(data) != self.layout.nbytes:
            raise ValueError(f"payload of {len(data)} bytes, expected {self.layout.nbytes}")
        header = {
            "fingerprint": self.fingerprint,
            "block_hash": block_hash,
            "parent_hash": parent_hash,
            "token_ids": list(token_ids),
            "dtype": self.layout.dtype,
            "shape": list(self.layout.shape),
            "payload_bytes": len(data),
            "crc32": zlib.crc32(data),
        }
        head = json.dumps(header).encode()
        path = self._path(block_hash)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(MAGIC + len(head).to_bytes(4, "little") + head + data)
        os.replace(tmp, path)
        size = path.stat().st_size
        with self._lock:
            self._index[block_hash] = StoredBlock(block_hash, parent_hash, tuple(token_ids), size)
            self._bytes += size
            self.stats["written"] += 1
        self._shrink()

    def _shrink(self) -> None:
        """Drop least recently used files until the store fits its capacity."""
        while True:
            with self._lock:
                if self._bytes <= self.capacity or not self._index:
                    return
                block_hash, block = self._index.popitem(last=False)
                self._bytes -= block.size
                self.removed.append(block_hash)
                self.stats["dropped"] += 1
            self._path(block_hash).unlink(missing_ok=True)

    # ---- reading ----

    def get(self, block_hash: int, token_ids) -> np.ndarray | None:
        """The block's payload, or None (absent, or the file failed a check and was deleted)."""
        with self._lock:
            block = self._index.get(block_hash)
            if block is None:
                return None
            self._index.move_to_end(block_hash)
        payload = self._read(self._path(block_hash), block_hash, tuple(token_ids))
        if payload is None:
            self._forget(block_hash)
            return None
        self.stats["read"] += 1
        return payload

    def _read(self, path: Path, block_hash: int | None, token_ids) -> np.ndarray | None:
        header, data = self._load(path)
        if header is None:
            return None
        if block_hash is not None and header.get("block_hash") != block_hash:
            return self._reject(path, "its header names another block")
        if token_ids is not None and tuple(header.get("token_ids", ())) != token_ids:
            return self._reject(path, "its tokens differ from the prompt's")
        return np.frombuffer(data, dtype=self.layout.dtype).reshape(self.layout.shape)

    def _load(self, path: Path) -> tuple[dict | None, bytes]:
        """(header, payload) of a file that passes every check, else (None, b"")."""
        try:
            raw = path.read_bytes()
        except OSError as exc:
            return self._reject(path, f"unreadable ({exc})"), b""
        if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 4:
            return self._reject(path, "not a KV block file"), b""
        start = len(MAGIC) + 4
        head_len = int.from_bytes(raw[len(MAGIC) : start], "little")
        if head_len > MAX_HEADER_BYTES or start + head_len > len(raw):
            return self._reject(path, "truncated header"), b""
        try:
            header = json.loads(raw[start : start + head_len])
        except ValueError:
            return self._reject(path, "unreadable header"), b""
        data = raw[start + head_len :]
        expected = {
            "fingerprint": self.fingerprint,
            "dtype": self.layout.dtype,
            "shape": list(self.layout.shape),
            "payload_bytes": self.layout.nbytes,
        }
        if not isinstance(header, dict) or any(header.get(k) != v for k, v in expected.items()):
            return self._reject(path, "another model or layout"), b""
        if len(data) != self.layout.nbytes or zlib.crc32(data) != header.get("crc32"):
            return self._reject(path, "truncated or corrupt payload"), b""
        return header, data

    def _reject(self, path: Path, why: str) -> None:
        log.warning("ignored KV block file %s: %s", path.name, why)
        self.stats["rejected"] += 1
        path.unlink(missing_ok=True)
        return None

    def _forget(self, block_hash: int) -> None:
        with self._lock:
            block = self._index.pop(block_hash, None)
            if block is not None:
                self._bytes -= block.size

    # ---- start-up ----

    def scan(self) -> int:
        """Index the files already in the folder (a restarted worker), oldest use first,
        checking each; returns how many were kept."""
        found = []
        for path in self.dir.glob("*.kv"):
            header, _ = self._load(path)
            if header is None:
                continue
            try:
                block_hash = int(header["block_hash"])
                block = StoredBlock(
                    block_hash,
                    int(header["parent_hash"]),
                    tuple(int(t) for t in header["token_ids"]),
                    path.stat().st_size,
                )
            except (KeyError, TypeError, ValueError, OSError):
                self._reject(path, "incomplete header")
                continue
            if path.name != f"{block_hash:016x}.kv":
                self._reject(path, "its name and header disagree")
                continue
            found.append((path.stat().st_mtime, block))
        for path in self.dir.glob("*.tmp"):
            path.unlink(missing_ok=True)  # a write that a crash interrupted
        with self._lock:
            for _, block in sorted(found, key=lambda item: item[0]):
                self._index[block.block_hash] = block
                self._bytes += block.size
        self._shrink()
        return len(self._index)

    def _path(self, block_hash: int) -> Path:
        return self.dir / f"{block_hash:016x}.kv"
