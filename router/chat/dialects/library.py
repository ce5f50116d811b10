"""mlx-lm's tool-call parsers (`mlx_lm/tool_parsers/*.py`), loaded without importing mlx-lm.

Each of those modules is plain Python over `json`, `ast` and `regex`: it has `tool_call_start`,
`tool_call_end` and `parse_tool_call(text, tools)`, which returns a call `{"name", "arguments"}`
or a list of them and raises on text it cannot read. Importing them the usual way would run
`mlx_lm/__init__.py`, which loads MLX and the generation code: a router has no use for either.
So the file is executed on its own, once, as a module of this package's namespace.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_PACKAGE = "_mlx_lm_tool_parsers"  # a stand-in parent, so their relative imports resolve


@functools.cache
def mlx_lm_parser(name: str) -> ModuleType:
    """mlx-lm's parser module `name` (e.g. "qwen3_coder"); ImportError when it has none."""
    if _PACKAGE not in sys.modules:
        spec = importlib.util.find_spec("mlx_lm")  # finds the package without running it
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("mlx-lm is not installed")
        package = ModuleType(_PACKAGE)
        package.__path__ = [str(Path(next(iter(spec.submodule_search_locations))) / "tool_parsers")]
        sys.modules[_PACKAGE] = package
    try:
        return importlib.import_module(f"{_PACKAGE}.{name}")
    except ModuleNotFoundError:
        raise ImportError(f"mlx-lm has no tool parser {name!r}") from None
