"""Where this worker's KV endpoint binds, and CURVE on the KV channel.

`kv_peer_bind` "auto" binds a free loopback port when the router is on loopback (a one-machine
fleet) and nothing otherwise; "off" binds nothing; else a ZeroMQ address (port 0: a free one).
Off loopback CURVE is required, as for the router socket: every worker of the fleet holds the
same KV-channel key pair (`kv_peer_key`, made by mlx-fleet-keys), and a KV endpoint serves and
a fetch talks only to holders of it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import zmq

from shared.curve import fingerprint, is_loopback_endpoint, load_secret, require_curve

log = logging.getLogger(__name__)

LOOPBACK_BIND = "tcp://127.0.0.1:0"


@dataclass(frozen=True)
class PeerChannel:
    """The KV channel's settings, resolved: bind address and CURVE key (None: plain)."""

    bind: str
    key: Path | None = None

    @classmethod
    def from_settings(
        cls, bind: str, key: Path | None, router: str | Sequence[str]
    ) -> PeerChannel | None:
        """None when the channel is off ("auto": on when every router is on loopback). Raises
        CurveError off loopback without a key."""
        routers = (router,) if isinstance(router, str) else router
        if bind == "off" or (bind == "auto" and not all(map(is_loopback_endpoint, routers))):
            return None
        bind = LOOPBACK_BIND if bind == "auto" else bind
        require_curve(bind, key is not None, "--kv-peer-bind")
        return cls(bind, key)

    def configure_server(self, sock: zmq.Socket):
        """CURVE server accepting only the fleet's KV key; the authenticator to stop."""
        if self.key is None:
            return None
        from zmq.auth.thread import ThreadAuthenticator

        public, secret = load_secret(self.key)
        auth = ThreadAuthenticator(sock.context, log=log.getChild("zap"))
        auth.start()
        auth.configure_curve_callback("*", _OneKey(public))
        sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True
        log.info("KV channel: CURVE on, key %s", fingerprint(public))
        return auth

    def configure_client(self, sock: zmq.Socket) -> None:
        if self.key is None:
            return
        public, secret = load_secret(self.key)
        sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = secret, public, public


def advertised(endpoint: str) -> str:
    """The address peers connect to: a wildcard bind names this host instead."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:"):
        if endpoint.startswith(wildcard):
            return f"tcp://{socket.gethostname()}:{endpoint[len(wildcard) :]}"
    return endpoint


class _OneKey:
    def __init__(self, public: bytes):
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        if key != self.public:
            log.warning("KV channel: refused a peer with unknown key %s", fingerprint(key))
        return key == self.public
