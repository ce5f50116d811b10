#!/usr/bin/env python3
"""Which of the router's files one streamed chat request passes through.

Starts the real router app (tiny tokenizer, ChatML template) on a real socket with a stand-in
worker, sends one request to warm everything up, then records every Python function call made
while a second streamed chat request is served, and prints one JSON line: the router/ and
shared/ files that ran, and their counts. A measure of how far a newcomer must read to follow a
request (issue #19: 30+ router files before the house was rebuilt).

    .venv/bin/python scripts/trace_request.py [--list]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import ClientSession  # noqa: E402
from aiohttp.test_utils import TestServer  # noqa: E402

from router.app import create_app  # noqa: E402
from router.config import ModelSpec, RouterConfig  # noqa: E402
from router.http import app_keys  # noqa: E402
from tests.support.fake_worker import FakeWorker, FakeWorkerConfig  # noqa: E402
from tests.support.tiny_model import build_tiny_model  # noqa: E402

BODY = {
    "model": "tiny",
    "stream": True,
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "Where does a streamed request go?"}],
}


class CallRecorder:
    """The project files whose functions are called while it is on (every thread)."""

    def __init__(self) -> None:
        self.files: set[str] = set()

    def _hook(self, frame, event, _arg):
        if event == "call":
            self.files.add(frame.f_code.co_filename)

    def __enter__(self) -> CallRecorder:
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *_exc) -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    def under(self, package: str) -> list[str]:
        base = ROOT / package
        return sorted(
            str(Path(f).relative_to(ROOT)) for f in self.files if Path(f).is_relative_to(base)
        )


async def stream_once(session: ClientSession, url: str) -> int:
    async with session.post(url, json=BODY) as response:
        response.raise_for_status()
        return len(await response.read())


async def main(show: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", context_length=256)
        config = RouterConfig(models=(ModelSpec(model_dir),), zmq_bind="tcp://127.0.0.1:*")
        server = TestServer(create_app(config))
        await server.start_server()
        endpoint = server.app[app_keys.LINK].endpoint
        worker = FakeWorker(FakeWorkerConfig(endpoint, "trace-0"))
        worker_task = asyncio.create_task(worker.run())
        await asyncio.wait_for(worker.registered.wait(), 10)
        url = str(server.make_url("/v1/chat/completions"))
        try:
            async with ClientSession() as session:
                await stream_once(session, url)  # warm-up: lazy imports, first-use caches
                with CallRecorder() as calls:
                    size = await stream_once(session, url)
        finally:
            worker_task.cancel()
            await asyncio.gather(worker_task, return_exceptions=True)
            await server.close()
    router_files, shared_files = calls.under("router"), calls.under("shared")
    result = {
        "router_files": len(router_files),
        "shared_files": len(shared_files),
        "response_bytes": size,
    }
    if show:
        result |= {"router": router_files, "shared": shared_files}
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the files, not only counts")
    print(json.dumps(asyncio.run(main(parser.parse_args().list))))
