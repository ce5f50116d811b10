"""router/api/ is pure translation: importing every adapter loads no HTTP or ZeroMQ library."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT

ADAPTERS = (
    "router.api.openai.adapter, router.api.anthropic.adapter, router.api.responses.adapter, "
    "router.api.checks"
)


def test_api_adapters_import_neither_aiohttp_nor_zmq():
    code = (
        f"import sys, {ADAPTERS}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'aiohttp', 'zmq'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
