"""ZeroMQ CURVE between the router and its workers: key files, and the socket-side setup.

The router's ROUTER socket is a CURVE server with a ZAP authenticator that accepts only the
client public keys found in a folder (read again at every handshake, so adding or removing a
worker's key needs no restart). A worker's DEALER socket is a CURVE client that knows the
router's public key, so it talks to the real router only. Key files are pyzmq's certificate
format (`zmq.auth.load_certificate` reads them): NAME.key (public, 0644) and NAME.key_secret
(public + secret, 0600). Logs name keys by fingerprint, never by content.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth

log = logging.getLogger(__name__)

SECRET_SUFFIX = ".key_secret"
PUBLIC_SUFFIX = ".key"


class CurveError(ValueError):
    """Missing or unusable key material, or an insecure setup; the message says what to do."""


# ------------------------------------------------------------ key files


def generate_keypair(out_dir: Path, name: str, force: bool = False) -> tuple[Path, Path]:
    """Write NAME.key (0644) and NAME.key_secret (0600, created so: never readable by others).

    Returns (public_file, secret_file). Refuses to overwrite unless `force`."""
    if not name or "/" in name or name.startswith("."):
        raise CurveError(f"key name {name!r}: use a plain file name like 'router' or 'worker-a'")
    out_dir.mkdir(parents=True, exist_ok=True)
    public_file, secret_file = out_dir / (name + PUBLIC_SUFFIX), out_dir / (name + SECRET_SUFFIX)
    if not force and (public_file.exists() or secret_file.exists()):
        raise CurveError(f"{public_file} or {secret_file} exists; pass --force to replace it")
    public, secret = zmq.curve_keypair()
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    _write(secret_file, 0o600, _cert_text(public, secret, stamp, name))
    _write(public_file, 0o644, _cert_text(public, None, stamp, name))
    return public_file, secret_file


def _cert_text(public: bytes, secret: bytes | None, stamp: str, name: str) -> str:
    kind = "SECRET key: keep it on this host, mode 0600" if secret else "public key"
    lines = [
        f"#   mlx-fleet ZeroMQ CURVE {kind}",
        f"#   name {name}, generated {stamp}, fingerprint {fingerprint(public)}",
        "",
        "metadata",
        "curve",
        f'    public-key = "{public.decode()}"',
    ]
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def _write(path: Path, mode: int, text: str) -> None:
    """Create `path` with `mode` from the start (no window where a secret is world-readable)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)  # the umask may have cleared bits of `mode` (0644 under umask 077)


def load_public(path: Path) -> bytes:
    public, _ = _load(path)
    return public


def load_secret(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) from a NAME.key_secret file; warns when others may read it."""
    public, secret = _load(path)
    if secret is None:
        raise CurveError(f"{path}: no secret key in it (is this the .key public file?)")
    if os.name == "posix" and path.stat().st_mode & 0o077:
        log.warning("%s can be read by other users; chmod 600 it", path)
    return public, secret


def _load(path: Path) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise CurveError(f"{path}: not a readable CURVE key file ({e})") from None


def fingerprint(public_key: bytes) -> str:
    """A short, stable name for a public key, for logs: sha256 of the Z85 text, 12 hex digits."""
    return hashlib.sha256(public_key).hexdigest()[:12]


def authorized_keys(folder: Path) -> dict[bytes, str]:
    """Z85 public key -> file name, for every *.key file in `folder`."""
    keys = {}
    for file in sorted(folder.glob("*" + PUBLIC_SUFFIX)):
        try:
            keys[load_public(file)] = file.name
        except CurveError as e:
            log.warning("skipped %s", e)
    return keys


# ------------------------------------------------------------ sockets


class _FolderOfKeys:
    """ZAP credentials provider: a client key is accepted iff a *.key file in the folder holds it."""

    def __init__(self, folder: Path):
        self.folder = folder

    def callback(self, domain: str, key: bytes) -> bool:
        name = authorized_keys(self.folder).get(key)
        if name is None:
            log.warning("refused a worker with unknown CURVE key %s", fingerprint(key))
            return False
        log.info("accepted worker key %s (%s)", fingerprint(key), name)
        return True


def configure_server(socket: zmq.Socket, server_secret_file: Path, allowed_clients_dir: Path):
    """Make `socket` (before bind) a CURVE server that accepts only keys in the folder.

    Returns the started authenticator: keep it, and `stop()` it before closing the context.
    An asyncio socket gets an AsyncioAuthenticator (call from inside the running loop); a plain
    one gets a ThreadAuthenticator."""
    public, secret = load_secret(Path(server_secret_file))
    folder = Path(allowed_clients_dir)
    if not folder.is_dir():
        raise CurveError(f"{folder}: the folder of authorized worker keys does not exist")
    if not authorized_keys(folder):
        log.warning("%s holds no *.key files: every worker will be refused", folder)
    auth = _authenticator(socket.context)
    auth.start()
    auth.configure_curve_callback("*", _FolderOfKeys(folder))
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_server = True
    log.info("CURVE on: router key %s, worker keys from %s", fingerprint(public), folder)
    return auth


def _authenticator(context: zmq.Context):
    import zmq.asyncio

    if isinstance(context, zmq.asyncio.Context):
        from zmq.auth.asyncio import AsyncioAuthenticator

        return AsyncioAuthenticator(context, log=log.getChild("zap"))
    from zmq.auth.thread import ThreadAuthenticator

    return ThreadAuthenticator(context, log=log.getChild("zap"))


def configure_client(socket: zmq.Socket, client_secret_file: Path, server_public_file: Path):
    """Make `socket` (before connect) a CURVE client that talks only to the server holding
    the secret key of `server_public_file`. Nothing to keep alive; returns None."""
    public, secret = load_secret(Path(client_secret_file))
    server_public = load_public(Path(server_public_file))
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_serverkey = server_public
    log.info(
        "CURVE on: worker key %s, router key %s", fingerprint(public), fingerprint(server_public)
    )


# ------------------------------------------------------------ when CURVE is required


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for addresses only this machine can reach: tcp on 127.0.0.0/8, ::1 or localhost,
    and ipc:// / inproc://. A wildcard (`*`), another interface or host name is not."""
    parts = urlsplit(endpoint)
    if parts.scheme in ("ipc", "inproc"):
        return True
    if parts.scheme != "tcp":
        return False
    host = parts.netloc.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # '*', an interface name, a host name
        return False


def require_curve(endpoint: str, curve_enabled: bool, what: str = "the ZeroMQ socket") -> None:
    """Refuse plain TCP beyond loopback: prompts and tokens would cross the network in clear,
    and anyone who can reach the port could pose as a worker."""
    if not curve_enabled and not is_loopback_endpoint(endpoint):
        raise CurveError(
            f"{what} uses {endpoint}, which is reachable from other machines, without CURVE "
            "encryption. Generate keys (mlx-fleet-keys generate) and set the curve_* keys in "
            "the config (docs/deploy.md), or use a 127.0.0.1 address."
        )
