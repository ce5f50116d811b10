"""Test helpers for tensor-parallel groups: a tiny model saved as an mlx-lm directory the
ranks can load, and real rank processes joined in a ring over loopback."""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from tests.support.tiny_model import build_tiny_model

TINY_TP_ARGS = dict(
    model_type="llama",
    hidden_size=32,
    num_hidden_layers=2,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=400,  # the tokenizer of build_tiny_model: servable over HTTP
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=512,
)


# qwen3: per-head q/k norms, tied embeddings, an explicit head_dim
TINY_TP_QWEN3_ARGS = {
    **TINY_TP_ARGS,
    "model_type": "qwen3",
    "head_dim": 8,
    "tie_word_embeddings": True,
    "rope_theta": 1e6,
}


# head vectors of 32 values: --kv-bits 8/4 quantize them in groups of 32 (TINY_TP_ARGS' 8 cannot)
TINY_TP_QUANT_ARGS = {**TINY_TP_ARGS, "head_dim": 32}


def save_tiny_model(directory: Path, seed: int = 0, args: dict = TINY_TP_ARGS) -> Path:
    """A random model (by default a llama with 4 query heads, 2 KV heads) with a tokenizer,
    loadable by mlx_lm.load."""
    module = importlib.import_module(f"mlx_lm.models.{args['model_type']}")
    build_tiny_model(directory, context_length=512)
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(args))
    mx.eval(model.parameters())
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **args}))
    return directory


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def ring_hostfile(path: Path, size: int) -> Path:
    path.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(size)]))
    return path


def rank_env(rank: int, hostfile: Path) -> dict:
    env = dict(os.environ, MLX_RANK=str(rank), MLX_HOSTFILE=str(hostfile))
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def start_ranks(size: int, args: list[str], workdir: Path) -> list[subprocess.Popen]:
    hostfile = ring_hostfile(workdir / "hostfile.json", size)
    return [
        subprocess.Popen(
            args,
            env=rank_env(rank, hostfile),
            stdout=open(workdir / f"rank{rank}.log", "wb"),  # noqa: SIM115 - the child owns it
            stderr=subprocess.STDOUT,
        )
        for rank in range(size)
    ]


def start_group_case(model_dir: Path, case: dict, size: int, workdir: Path):
    """Start the ranks of `case` (see tests/support/tp_rank_main.py); the processes and rank 0's
    result file (written once the case's phases are done)."""
    (workdir / "case.json").write_text(json.dumps(case))
    out = workdir / "out.json"
    args = [
        sys.executable,
        "-m",
        "tests.support.tp_rank_main",
        str(model_dir),
        str(workdir / "case.json"),
        str(out),
    ]
    return start_ranks(size, args, workdir), out


def rank_logs(workdir: Path, size: int) -> str:
    return "\n".join((workdir / f"rank{r}.log").read_text()[-3000:] for r in range(size))


def run_group_case(model_dir: Path, case: dict, size: int, workdir: Path, timeout: float) -> dict:
    """Run `case` (see tests/support/tp_rank_main.py) on a group of `size` real ranks; rank 0's result."""
    procs, out = start_group_case(model_dir, case, size, workdir)
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0] * size, f"rank exit codes {codes}\n{rank_logs(workdir, size)}"
    return json.loads(out.read_text())
