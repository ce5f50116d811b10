"""`mlx-fleet-keys`: make the fleet's secrets: CURVE key pairs and HTTP API keys."""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import sys
from pathlib import Path

from shared.curve import CurveError, fingerprint, generate_keypair, load_public

API_KEY_PREFIX = "mlxf-"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlx-fleet-keys", description="Generate mlx-fleet keys (see docs/deploy.md)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="a ZeroMQ CURVE key pair: NAME.key, NAME.key_secret")
    gen.add_argument("--out", type=Path, required=True, help="folder to write the files into")
    gen.add_argument("--name", required=True, help="e.g. router, or the worker's host name")
    gen.add_argument("--force", action="store_true", help="replace existing files")
    api = sub.add_parser("api-key", help="a new HTTP API key, appended to a keys file (0600)")
    api.add_argument("--file", type=Path, required=True, help="the router's api_keys_file")
    api.add_argument("--label", default="", help="a comment written above the key")
    fp = sub.add_parser("fingerprint", help="the fingerprint logs use for a CURVE key file")
    fp.add_argument("files", nargs="+", type=Path)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"generate": _generate, "api-key": _api_key, "fingerprint": _fingerprint}[
            args.command
        ](args)
    except CurveError as e:
        print(f"mlx-fleet-keys: {e}", file=sys.stderr)
        return 1


def _generate(args) -> int:
    public_file, secret_file = generate_keypair(args.out, args.name, args.force)
    print(f"public  {public_file}  (copy to the other side)")
    print(f"secret  {secret_file}  (0600, stays on this host)")
    print(f"fingerprint {fingerprint(load_public(public_file))}")
    return 0


def _api_key(args) -> int:
    """Append a fresh key; print it once (the caller hands it to the client)."""
    key = API_KEY_PREFIX + secrets.token_urlsafe(32)
    args.file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        if args.label:
            f.write(f"# {args.label}\n")
        f.write(key + "\n")
    print(key)
    print(f"appended to {args.file} (fingerprint {api_key_fingerprint(key)})", file=sys.stderr)
    return 0


def _fingerprint(args) -> int:
    for file in args.files:
        print(f"{fingerprint(load_public(file))}  {file}")
    return 0


def api_key_fingerprint(key: str) -> str:
    """How logs name an API key: 8 hex digits of its sha256 (the router uses the same)."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


if __name__ == "__main__":
    sys.exit(main())
