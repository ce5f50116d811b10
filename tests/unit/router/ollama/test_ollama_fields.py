"""Every Ollama request field and option is in docs/api.md's tables, and known to the code
(the convention of tests/unit/router/api/test_known_fields.py)."""

from __future__ import annotations

import re

import pytest

from router.api.ollama.parse import CHAT_FIELDS, GENERATE_FIELDS, OPTIONS
from router.http.endpoints.ollama import EMBED_FIELDS
from tests.support.paths import ROOT

SECTIONS = {
    "## POST /api/chat (Ollama)": CHAT_FIELDS,
    "## POST /api/generate (Ollama)": GENERATE_FIELDS,
    "## Ollama options": OPTIONS,
    "## POST /api/embed (Ollama)": EMBED_FIELDS,
}


def documented(heading: str) -> set[str]:
    """The backticked names in the first column of the table under `heading`."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split(" | ", 1)[0]
            names |= set(re.findall(r"`([a-z_]+)`", first_cell))
    return names


@pytest.mark.parametrize("heading", SECTIONS)
def test_the_code_knows_exactly_the_documented_fields(heading):
    assert documented(heading) == SECTIONS[heading]
