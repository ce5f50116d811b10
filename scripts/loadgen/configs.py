"""The configurations the comparison runner knows: ours with N workers and a routing policy
(with or without KV pulls between workers, disaggregated prefill, quantized KV), and the peers a Mac user could pick instead on the same model: mlx_lm.server, and vllm-mlx
(continuous batching + prefix cache) where `scripts/setup-vllm-mlx` installed it."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

from scripts.loadgen.services import ServiceSpec, free_port

POLICIES = ("cache_aware", "round_robin", "least_load")
DEFAULT_CONFIGS = (
    "ours-1",
    "ours-2-cache_aware",
    "ours-2-round_robin",
    "ours-2-least_load",
    "mlx_lm",
)
# ours-N[-both][-POLICY][-nopull][-kvB][-spec]: N workers (doing both prefill and decode:
# "-both" only names that), a routing policy, the router's KV pulls off, B-bit KV (8, 4),
# speculative decoding (ngram drafts) on. ours-disagg[...]: 1 prefill worker + 1 decode worker.
KV_BITS = ("8", "4", "16")
OURS = re.compile(
    r"ours-(?:(?P<workers>[1-9][0-9]*)(?:-both)?|(?P<disagg>disagg))"
    rf"(?:-(?P<policy>{'|'.join(POLICIES)}))?(?P<nopull>-nopull)?"
    rf"(?:-kv(?P<kv_bits>{'|'.join(KV_BITS)}))?(?P<spec>-spec)?"
)
MLX_LM_MODEL_NAME = "default_model"  # mlx_lm.server: the --model it was started with
PEERS = ("mlx_lm", "vllm_mlx")
# its own venv: it pulls torch; MLX_FLEET_VLLM_MLX names another executable
VLLM_MLX = Path(__file__).resolve().parents[2] / ".venv-vllm-mlx" / "bin" / "vllm-mlx"


def vllm_mlx_executable() -> Path | None:
    path = Path(os.environ.get("MLX_FLEET_VLLM_MLX", VLLM_MLX))
    return path if path.exists() else None


def parse_configs(text: str) -> list[str]:
    """Comma-separated names, checked; ValueError names the bad one and the valid forms."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        match = OURS.fullmatch(name)
        if name == "vllm_mlx" and vllm_mlx_executable() is None:
            raise ValueError(
                "vllm_mlx is not installed: run scripts/setup-vllm-mlx (a separate venv, "
                "several minutes), or set MLX_FLEET_VLLM_MLX to its executable"
            )
        if name in PEERS or (match and (match["policy"] or "cache_aware") in POLICIES):
            continue
        raise ValueError(
            f"unknown configuration {name!r}: use ours-N (N workers, cache_aware) or "
            "ours-disagg (1 prefill + 1 decode worker), then optionally -POLICY (one of "
            f"{', '.join(POLICIES)}), -nopull (router's KV pulls off), -kv8 or -kv4 "
            "(quantized KV), -spec (speculative decoding on), in that order; mlx_lm or vllm_mlx"
        )
    if not names:
        raise ValueError("no configuration given")
    return names


def service_spec(
    name: str,
    model_dir: Path,
    baseline_model_dir: Path,
    launch_cmd: str,
    extra_launch_args: str = "",
    extra_baseline_args: str = "",
    baseline_env: dict[str, str] | None = None,
) -> ServiceSpec:
    """How to start configuration `name` on a fresh localhost port."""
    port = free_port()
    if name == "mlx_lm":
        argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(baseline_model_dir)]
        argv += ["--host", "127.0.0.1", "--port", str(port), *shlex.split(extra_baseline_args)]
        return ServiceSpec(name, argv, port, MLX_LM_MODEL_NAME, None, baseline_env or {})
    if name == "vllm_mlx":
        argv = [
            str(vllm_mlx_executable()),
            "serve",
            str(baseline_model_dir),
            "--continuous-batching",
            "--enable-prefix-cache",
            "--offline",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        return ServiceSpec(name, argv, port, None, None, baseline_env or {})
    match = OURS.fullmatch(name)
    policy = match["policy"] or "cache_aware"
    if match["disagg"]:
        shape, workers = ["--prefill-workers", "1", "--workers", "1"], 2
    else:
        workers = int(match["workers"])
        shape = ["--workers", str(workers)]
    argv = [*shlex.split(launch_cmd), *shape, "--policy", policy]
    argv += ["--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    if match["nopull"]:
        argv += ["--kv-pulls", "false"]
    if match["kv_bits"]:
        argv += ["--kv-bits", match["kv_bits"]]
    if match["spec"]:
        argv += ["--speculative", "ngram"]
    argv += shlex.split(extra_launch_args)
    return ServiceSpec(name, argv, port, None, workers)
