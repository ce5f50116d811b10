"""One owner of KV memory (issue 49): outside the KV store (worker/kv/) and the KV manager's
package (worker/engine/caches/), nothing calls a method of the block pool or the radix tree;
the scheduler, the engine, peer transfers and the rest ask the `KVManager`. The runner may
read the pool's arrays (the K/V it runs the forward over), which calls nothing."""

from __future__ import annotations

import ast
from pathlib import Path

from worker.kv.block_pool import BlockPool
from worker.kv.radix_cache import RadixCache

ROOT = Path(__file__).resolve().parents[4]
OWNERS = ("worker/kv/", "worker/engine/caches/")  # (a TP follower's: caches/mirror.py)


def _methods(cls: type) -> set[str]:
    return {
        name
        for name, value in vars(cls).items()
        if not name.startswith("_")
        and (callable(value) or isinstance(value, staticmethod | classmethod))
    }


METHODS = _methods(BlockPool) | _methods(RadixCache)


def _receiver(node: ast.expr) -> str | None:
    """The name a method is called on: `pool` for `pool.x()`, `self.pool.x()`, ..."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def pool_and_tree_calls(path: Path) -> list[str]:
    """Calls in `path` of a pool or tree method on something named `pool` or `cache`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr in METHODS and _receiver(node.func.value) in ("pool", "cache"):
            found.append(f"{node.lineno}: {ast.unparse(node.func)}")
    return found


def test_only_the_kv_manager_calls_the_pool_and_the_radix_tree():
    calls = {}
    for path in sorted((ROOT / "worker").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(OWNERS):
            continue
        if found := pool_and_tree_calls(path):
            calls[rel] = found
    assert not calls, f"pool or radix tree methods called outside the KV manager: {calls}"


def test_the_check_can_fail():
    scheduler_before = "def grow(self, seq, n):\n    seq.block_ids += self.pool.allocate(n)\n"
    tree = ast.parse(scheduler_before)
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call))
    assert call.func.attr in METHODS and _receiver(call.func.value) == "pool"
    assert {"allocate", "incref", "match_prefix", "lock", "evict", "insert"} <= METHODS
