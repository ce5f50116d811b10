"""A stand-in for the Hugging Face Hub's file API, enough for huggingface_hub's downloads
(docs: /work/shared/DESIGN.md, "huggingface_hub 2.x downloads from any server..."):

    GET  /api/models/{org}/{name}/revision/{rev}     -> {"id", "sha", "siblings": [...]}
    HEAD /{org}/{name}/resolve/{rev}/{file}          -> X-Repo-Commit, ETag (+ X-Linked-*)
    GET  /{org}/{name}/resolve/{rev}/{file}          -> the bytes (Range: bytes=N- honoured)

Weight files (.safetensors) are served as the Hub serves LFS files: `X-Linked-Etag` is their
sha256 and `X-Linked-Size` their size; other files' ETag is their git blob sha1. `throttle`
(bytes a second) slows every GET so a test can kill a download midway; `corrupt` names files
(`org/name/file`) served with one byte changed under their true checksum headers. `served`
counts the body bytes sent per file (`org/name/file`: a resumed download fetches fewer). With `token` every request must bear it,
as a private repo's do."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

CHUNK = 16 * 1024
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".npz")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubRepo:
    directory: Path

    def files(self) -> list[str]:
        return sorted(
            str(p.relative_to(self.directory)) for p in self.directory.rglob("*") if p.is_file()
        )

    @property
    def sha(self) -> str:
        digest = hashlib.sha1()
        for name in self.files():
            digest.update(name.encode() + (self.directory / name).read_bytes())
        return digest.hexdigest()


@dataclass
class HubServer:
    repos: dict[str, Path]
    throttle: float | None = None  # bytes a second of every GET body
    corrupt: set[str] = field(default_factory=set)  # org/name/file served with a wrong byte
    served: Counter = field(default_factory=Counter)  # body bytes sent, by org/name/file
    token: str | None = None  # set: every request must bear it (a private repo), else 401
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}/revision/{rev}", self.revision)
        app.router.add_route("*", "/{org}/{name}/resolve/{rev}/{file:.+}", self.resolve)
        return app

    def _repo(self, request: web.Request) -> HubRepo:
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            raise web.HTTPUnauthorized(
                headers={"X-Error-Code": "RepoNotFound"}, text="Repository not found"
            )
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        if repo_id not in self.repos:
            raise web.HTTPNotFound(
                headers={"X-Error-Code": "RepoNotFound"}, text="Repository not found"
            )
        repo = HubRepo(self.repos[repo_id])
        if request.match_info["rev"] not in ("main", repo.sha):
            raise web.HTTPNotFound(
                headers={"X-Error-Code": "RevisionNotFound"}, text="Revision not found"
            )
        return repo

    async def revision(self, request: web.Request) -> web.Response:
        repo = self._repo(request)
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        siblings = [{"rfilename": name} for name in repo.files()]
        return web.json_response({"id": repo_id, "sha": repo.sha, "siblings": siblings})

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        repo = self._repo(request)
        name = request.match_info["file"]
        key = f"{request.match_info['org']}/{request.match_info['name']}/{name}"
        path = repo.directory / name
        if not path.is_file():
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound"}, text="no such file")
        data = path.read_bytes()
        headers = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if name.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            headers |= {"ETag": f'"{sha256}"', "X-Linked-Etag": f'"{sha256}"'}
            headers["X-Linked-Size"] = str(len(data))
        else:
            headers["ETag"] = f'"{git_blob_sha1(data)}"'
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(data))
            return web.Response(headers=headers)
        if key in self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        start = _range_start(request.headers.get("Range"))
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        headers["Content-Length"] = str(len(data) - start)
        response = web.StreamResponse(status=status, headers=headers)
        await response.prepare(request)
        for offset in range(start, len(data), CHUNK):
            piece = data[offset : offset + CHUNK]
            await response.write(piece)
            self.served[key] += len(piece)
            if self.throttle:
                await asyncio.sleep(len(piece) / self.throttle)
        await response.write_eof()
        return response


def _range_start(header: str | None) -> int:
    """The N of `bytes=N-` (huggingface_hub resumes with it), else 0."""
    if not header or not header.startswith("bytes="):
        return 0
    first = header.removeprefix("bytes=").split("-", 1)[0]
    return int(first) if first.isdigit() else 0


@contextlib.contextmanager
def serving(server: HubServer) -> Iterator[HubServer]:
    """`server` on a free loopback port, in a thread of its own, while the block runs."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner = web.AppRunner(server.app(), access_log=None)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        server.url = f"http://127.0.0.1:{port}"
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    ready.wait(10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
