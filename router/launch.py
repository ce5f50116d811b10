"""`launch-cluster`: start a router and N workers on this machine (placeholder until the
cluster lands; it already resolves the model so a first run converts the default)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch-cluster",
        description="Start an mlx-fleet router and N MLX worker processes on this machine.",
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--model", help="model dir, .gguf, HF repo id, or the default model")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    return parser


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)
    print("launch-cluster: the cluster is not built yet; use `mlx-fleet-model generate`.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
