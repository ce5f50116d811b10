"""Models fetched from the Hugging Face Hub (a catalog entry's `source`), checked file by file.

huggingface_hub lists the repo at a revision (`model_info`), reads each file's metadata (a HEAD:
its size, and its ETag: the sha256 of an LFS file, the git blob sha1 of another), builds the
request headers (HF_TOKEN) and knows the endpoint (HF_ENDPOINT) and offline mode
(HF_HUB_OFFLINE). The transfer is ours: huggingface_hub 2.x writes each file to a fresh
temporary name and deletes it on failure, so a download killed midway starts over. Here a file
grows in `blobs/<etag>.incomplete` in the Hub's cache layout and a later fetch asks for the rest
(`Range: bytes=N-`); its hash is computed as it arrives and checked against the Hub's before
the file takes its place (`blobs/<etag>`, linked from `snapshots/<commit>/<name>`), so a
worker never loads a file the Hub did not publish. A fetch that checked every file leaves a
marker beside the repo's cache (`.mlx-fleet-verified/`): a later fetch, offline or not,
trusts that snapshot without reading the Hub or hashing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import quote

# what a worker reads of an mlx-lm model repo (shared/models/store.py downloads the same)
DEFAULT_PATTERNS = ("*.json", "*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt")
WEIGHT_PATTERNS = ("*.safetensors", "*.gguf", "*.bin", "*.npz", "*.pt", "*.pth")
CHUNK_BYTES = 1 << 20
_HEX40, _HEX64 = re.compile(r"^[0-9a-f]{40}$"), re.compile(r"^[0-9a-f]{64}$")


class DownloadError(Exception):
    """A model that could not be fetched or failed its check; the message names the cause."""


def source_of(model) -> HubSource | None:
    """The Hub source of a [model] / [[models]] entry (shared/config/sections.py
    ModelSection: `source`, `revision`, `allow_patterns`), or None when it has none."""
    if model.source is None:
        return None
    patterns = model.allow_patterns if model.allow_patterns is not None else DEFAULT_PATTERNS
    return HubSource(model.source, model.revision or "main", tuple(patterns))


@dataclass(frozen=True)
class HubSource:
    """A repo at a revision, and which of its files a worker needs."""

    repo: str
    revision: str = "main"
    allow_patterns: tuple[str, ...] = DEFAULT_PATTERNS
    ignore_patterns: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.repo}@{self.revision}"

    def wants(self, name: str) -> bool:
        allowed = any(fnmatch(name, p) for p in self.allow_patterns)
        return allowed and not any(fnmatch(name, p) for p in self.ignore_patterns)

    def without_weights(self) -> HubSource:
        """The same files less the weights: what a router needs (config, tokenizer)."""
        return HubSource(self.repo, self.revision, self.allow_patterns, WEIGHT_PATTERNS)

    @property
    def key(self) -> str:
        """Names the file set (a marker per set: another set may hold other files)."""
        text = json.dumps([self.allow_patterns, self.ignore_patterns])
        return hashlib.sha1(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int
    etag: str  # the sha256 of an LFS file (64 hex digits), else the git blob sha1 (40)

    def hasher(self):
        """A hash whose hexdigest, fed the file, equals `etag`."""
        if _HEX64.match(self.etag):
            return hashlib.sha256()
        if _HEX40.match(self.etag):
            return hashlib.sha1(b"blob %d\0" % self.size)
        raise DownloadError(
            f"cannot check {self.name}: the Hub's ETag {self.etag!r} is neither a sha256 nor a "
            "git sha1"
        )

    @property
    def is_weights(self) -> bool:
        return any(fnmatch(self.name, p) for p in WEIGHT_PATTERNS)


@dataclass(frozen=True)
class Plan:
    """What a fetch of `source` brings: its files at `commit`, where they go in the cache."""

    source: HubSource
    commit: str
    files: tuple[HubFile, ...]
    repo_dir: Path  # <cache>/models--org--name

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_bytes(self) -> int:
        return sum(f.size for f in self.files if f.is_weights)

    @property
    def snapshot(self) -> Path:
        return self.repo_dir / "snapshots" / self.commit

    def blob(self, file: HubFile) -> Path:
        return self.repo_dir / "blobs" / file.etag

    def partial(self, file: HubFile) -> Path:
        return self.repo_dir / "blobs" / f"{file.etag}.incomplete"

    def held_bytes(self) -> int:
        """Bytes of its files in the cache now, whole or partial."""
        total = 0
        for file in self.files:
            for path in (self.blob(file), self.partial(file)):
                if path.is_file():
                    total += min(path.stat().st_size, file.size)
                    break
        return total


@dataclass
class Progress:
    """A fetch's bytes, read by another thread while it runs (plain ints: no lock needed)."""

    done_bytes: int = 0
    total_bytes: int = 0
    fetched_bytes: int = 0  # of done_bytes, those that came over the network in this fetch

    @property
    def percent(self) -> int:
        return 100 * self.done_bytes // self.total_bytes if self.total_bytes else 0


@dataclass
class Downloader:
    """Fetches sources into the Hub's cache. `endpoint`, `token`, `cache_dir`: None takes
    huggingface_hub's own (HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE)."""

    endpoint: str | None = None
    token: str | None = None
    cache_dir: Path | None = None
    offline: bool | None = None  # None: HF_HUB_OFFLINE
    chunk_bytes: int = CHUNK_BYTES
    timeout_s: float = 30.0
    hub_url: str = field(init=False)  # `endpoint`, or huggingface_hub's
    cache: Path = field(init=False)  # `cache_dir`, or huggingface_hub's

    def __post_init__(self) -> None:
        from huggingface_hub import constants

        self.hub_url = (self.endpoint or constants.ENDPOINT).rstrip("/")
        self.cache = Path(self.cache_dir or constants.HF_HUB_CACHE)
        if self.offline is None:
            self.offline = bool(constants.HF_HUB_OFFLINE)

    def file_url(self, repo: str, revision: str, name: str) -> str:
        """Where the Hub serves a file (hf_hub_url's form, built on `hub_url` itself: its
        template is fixed when huggingface_hub is imported)."""
        return f"{self.hub_url}/{repo}/resolve/{quote(revision, safe='')}/{quote(name)}"

    def repo_dir(self, source: HubSource) -> Path:
        return self.cache / ("models--" + source.repo.replace("/", "--"))

    # ------------------------------------------------------------ without the network

    def local(self, source: HubSource) -> Path | None:
        """The snapshot of `source` a fetch checked whole, or None (nothing read from the Hub)."""
        repo_dir = self.repo_dir(source)
        commit = source.revision
        if not _HEX40.match(commit):
            try:
                commit = (repo_dir / "refs" / source.revision).read_text().strip()
            except OSError:
                return None
        try:
            names = json.loads(self._marker(repo_dir, commit, source).read_text())
        except (OSError, ValueError):
            return None
        snapshot = repo_dir / "snapshots" / commit
        if not isinstance(names, list) or not all((snapshot / n).is_file() for n in names):
            return None
        return snapshot

    @staticmethod
    def _marker(repo_dir: Path, commit: str, source: HubSource) -> Path:
        return repo_dir / ".mlx-fleet-verified" / f"{commit}-{source.key}.json"

    # ------------------------------------------------------------ with the network

    def pull(self, source: HubSource, progress: Progress | None = None) -> Path:
        """The local snapshot of `source`: the checked one in the cache, else fetched now."""
        if (path := self.local(source)) is not None:
            if progress is not None:
                progress.total_bytes = progress.done_bytes = 1
            return path
        return self.fetch(self.plan(source), progress)

    def metadata(self, source: HubSource) -> tuple[Path, int | None]:
        """What a router reads of `source` (config, tokenizer: fetched and checked, weights
        left out) and its weights' bytes by the Hub's listing (None: offline, unknown)."""
        if (whole := self.local(source)) is not None:
            return whole, None  # the weights are here: the caller measures them
        light = source.without_weights()
        if self.offline:
            return self.pull(light), None
        plan = self.plan(source)
        files = tuple(f for f in plan.files if light.wants(f.name))
        path = self.local(light) or self.fetch(Plan(light, plan.commit, files, plan.repo_dir))
        return path, plan.weight_bytes

    def plan(self, source: HubSource) -> Plan:
        """Ask the Hub for `source`'s commit and its wanted files' sizes and hashes."""
        if self.offline:
            raise DownloadError(
                f"{source} is not in the cache at {self.cache} and the Hub is off "
                "(HF_HUB_OFFLINE is set)"
            )
        from huggingface_hub import HfApi, get_hf_file_metadata

        with self._errors(source):
            api = HfApi(endpoint=self.hub_url, token=self.token)
            info = api.model_info(source.repo, revision=source.revision, timeout=self.timeout_s)
            if info.sha is None:
                raise DownloadError(f"the Hub gave no commit for {source}")
            names = sorted(s.rfilename for s in info.siblings or () if source.wants(s.rfilename))
            if not names:
                raise DownloadError(
                    f"{source} has no file that allow_patterns {list(source.allow_patterns)} picks"
                )
            files = []
            for name in names:
                url = self.file_url(source.repo, info.sha, name)
                meta = get_hf_file_metadata(url, token=self.token, timeout=self.timeout_s)
                if meta.etag is None or meta.size is None:
                    raise DownloadError(f"the Hub gave no ETag or size for {name} of {source}")
                files.append(HubFile(name, meta.size, meta.etag))
        return Plan(source, info.sha, tuple(files), self.repo_dir(source))

    def fetch(self, plan: Plan, progress: Progress | None = None) -> Path:
        """Mutates the cache: every file of `plan` fetched (the rest of a partial one) and
        checked, linked into its snapshot; DownloadError naming a file whose hash is wrong
        (its bytes are discarded)."""
        progress = progress or Progress()
        progress.total_bytes, progress.done_bytes = plan.total_bytes, plan.held_bytes()
        for file in plan.files:
            if plan.blob(file).is_file():
                self._check_blob(plan, file)  # there before: put by another tool, unchecked
            else:
                self._fetch_file(plan, file, progress)
            self._link(plan, file)
            progress.done_bytes = plan.held_bytes()
        if plan.source.revision != plan.commit:
            ref = plan.repo_dir / "refs" / plan.source.revision
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(plan.commit)
        marker = self._marker(plan.repo_dir, plan.commit, plan.source)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps([f.name for f in plan.files]))
        return plan.snapshot

    def _check_blob(self, plan: Plan, file: HubFile) -> None:
        digest = file.hasher()
        with open(plan.blob(file), "rb") as f:
            while piece := f.read(self.chunk_bytes):
                digest.update(piece)
        if digest.hexdigest() != file.etag:
            plan.blob(file).unlink()
            raise _mismatch(plan, file, digest.hexdigest())

    def _fetch_file(self, plan: Plan, file: HubFile, progress: Progress) -> None:
        """`file` fetched under huggingface_hub's own lock for it (`.locks/<repo>/<etag>.lock`):
        two agents sharing a cache never append to one partial file; the second finds the
        blob the first put in place."""
        from filelock import FileLock

        lock = self.cache / ".locks" / plan.repo_dir.name / f"{file.etag}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock)):
            if plan.blob(file).is_file():  # the other holder of the lock fetched it
                self._check_blob(plan, file)
                return
            self._fetch_unlocked(plan, file, progress)

    def _fetch_unlocked(self, plan: Plan, file: HubFile, progress: Progress) -> None:
        """The rest of `file` appended to its partial, hashed, then renamed into place."""
        partial = plan.partial(file)
        partial.parent.mkdir(parents=True, exist_ok=True)
        digest = file.hasher()
        have = 0
        if partial.is_file():
            with open(partial, "rb") as f:
                while piece := f.read(self.chunk_bytes):
                    digest.update(piece)
                    have += len(piece)
        if have > file.size:  # not this file's beginning: start over
            partial.unlink()
            progress.done_bytes -= min(have, file.size)
            digest, have = file.hasher(), 0
        if have < file.size:
            self._transfer(plan, file, partial, have, digest, progress)
        if (got := digest.hexdigest()) != file.etag:
            partial.unlink(missing_ok=True)
            raise _mismatch(plan, file, got)
        os.replace(partial, plan.blob(file))

    def _transfer(self, plan, file: HubFile, partial: Path, have: int, digest, progress) -> None:
        from huggingface_hub.utils import build_hf_headers, get_session

        url = self.file_url(plan.source.repo, plan.commit, file.name)
        headers = build_hf_headers(token=self.token) | {"Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        stream = get_session().stream(
            "GET", url, headers=headers, follow_redirects=True, timeout=self.timeout_s
        )
        with self._errors(plan.source), open(partial, "ab") as out, stream as response:
            if response.status_code >= 400:
                raise DownloadError(
                    f"{file.name} of {plan.source}: the Hub answered {response.status_code}"
                )
            if have and response.status_code != 206:  # the range was not honoured
                raise DownloadError(
                    f"{file.name} of {plan.source}: the Hub did not resume the download "
                    f"(status {response.status_code} to a range request)"
                )
            for piece in response.iter_bytes():  # as they arrive (progress, a kill midway)
                if have + len(piece) > file.size:
                    raise DownloadError(
                        f"{file.name} of {plan.source}: the Hub sent more than its "
                        f"{file.size} bytes"
                    )
                out.write(piece)
                digest.update(piece)
                have += len(piece)
                progress.done_bytes += len(piece)
                progress.fetched_bytes += len(piece)
        if have != file.size:
            raise DownloadError(
                f"{file.name} of {plan.source}: the transfer ended at {have} of {file.size} "
                "bytes (fetch again to resume)"
            )

    @staticmethod
    def _link(plan: Plan, file: HubFile) -> None:
        link = plan.snapshot / file.name
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(plan.blob(file), link.parent)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)

    def _errors(self, source: HubSource):
        return _HubErrors(source, self.hub_url)


def _mismatch(plan: Plan, file: HubFile, got: str) -> DownloadError:
    kind = "sha256" if len(file.etag) == 64 else "git sha1"
    return DownloadError(
        f"{file.name} of {plan.source} failed its checksum: {kind} {got}, the Hub says "
        f"{file.etag} (the file was discarded)"
    )


class _HubErrors:
    """A context turning huggingface_hub's and the transport's errors into DownloadError."""

    def __init__(self, source: HubSource, endpoint: str):
        self.source, self.endpoint = source, endpoint

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if exc is None or isinstance(exc, DownloadError):
            return
        from huggingface_hub.errors import (
            GatedRepoError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        where = f"{self.source} from {self.endpoint}"
        if isinstance(exc, GatedRepoError):
            why = "the repo is gated: set HF_TOKEN to a token that has access"
        elif isinstance(exc, RepositoryNotFoundError):
            why = "no such repo (or it is private: set HF_TOKEN)"
        elif isinstance(exc, RevisionNotFoundError):
            why = f"no revision {self.source.revision!r}"
        elif isinstance(exc, OSError | ConnectionError | TimeoutError) or _transport(exc):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            why = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        else:
            return
        raise DownloadError(f"cannot fetch {where}: {why}") from exc


def _transport(exc: BaseException) -> bool:
    """An error of the HTTP client under huggingface_hub (httpx or its fork)."""
    return type(exc).__module__.split(".")[0].startswith("httpx")
