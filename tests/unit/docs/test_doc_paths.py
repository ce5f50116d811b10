"""The guides name only files and modules that exist: every backticked path (`engine/states.py`,
`worker/kv/`) and dotted module (`worker.kv.pins`) in docs/architecture.md and docs/internals.md
is found in the tree, so a rename that leaves the guide behind fails here."""

from __future__ import annotations

import re

import pytest

from tests.support.paths import ROOT

GUIDES = ("docs/architecture.md", "docs/internals.md")
TOPS = ("router", "worker", "shared", "fleet", "scripts", "tests", "docs", "deploy")
_SKIP_DIRS = {".venv", ".git", "__pycache__", ".agents", "node_modules"}


def _tree() -> set[str]:
    """Every file and folder path under the project's top folders, relative to the root."""
    paths = set(TOPS)
    for top in TOPS:
        for path in (ROOT / top).rglob("*"):
            if not _SKIP_DIRS & set(path.parts):
                paths.add(path.relative_to(ROOT).as_posix())
    return paths


TREE = _tree()


def _found(name: str) -> bool:
    """A path is found when some file or folder ends with it (`engine/scheduler.py` is
    worker/engine/scheduler.py); a dotted module when its file, or the file of its parent (an
    attribute), is."""
    name = name.rstrip("/.,:;")
    if re.fullmatch(r"(router|worker|shared|fleet)(\.\w+)+", name):
        module = "/".join(name.split("."))
        parent = module.rsplit("/", 1)[0]
        return module + ".py" in TREE or module in TREE or parent + ".py" in TREE
    return any(
        p in (name, name + ".py") or p.endswith(("/" + name, "/" + name + ".py")) for p in TREE
    )


def named_paths(text: str) -> set[str]:
    names = set()
    for quoted in re.findall(r"`([^`\n]+)`", text):
        if "*" in quoted or "<" in quoted:  # a pattern (`scripts/bench_*.py`), not a path
            continue
        for word in re.findall(r"[\w./-]+", quoted):
            if word.startswith(("http", "/", "~", ".", "-")) or "*" in word:
                continue
            looks_like_path = word.endswith(".py") or ("/" in word and word[0].isalpha())
            if looks_like_path or re.fullmatch(r"(router|worker|shared|fleet)(\.\w+)+", word):
                names.add(word)
    return names


@pytest.mark.parametrize("guide", GUIDES)
def test_every_path_the_guide_names_exists(guide):
    text = (ROOT / guide).read_text()
    missing = sorted(name for name in named_paths(text) if not _found(name))
    assert not missing, f"{guide} names what does not exist: {missing}"


def test_the_check_can_fail():
    assert not _found("worker/engine/paged_layer_cache.py")
    assert not _found("worker.attention.metal_kernel")
    assert _found("engine/scheduler.py") and _found("worker.kv.pins.PrefixPins")
