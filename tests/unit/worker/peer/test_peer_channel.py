"""The KV channel's settings and CURVE: where it binds, and who may talk to it."""

from __future__ import annotations

import pytest
import zmq

from shared.curve import CurveError, generate_keypair
from shared.kv_transfer import Probe, ProbeReply
from worker.cli import build_parser, load_settings
from worker.peer.channel import PeerChannel, advertised
from worker.peer.fetch import PeerUnreachable, ask
from worker.peer.server import PeerServer

LOCAL, REMOTE = "tcp://127.0.0.1:5555", "tcp://10.0.0.1:5555"


def test_auto_binds_loopback_only_with_a_loopback_router():
    assert PeerChannel.from_settings("auto", None, LOCAL) == PeerChannel("tcp://127.0.0.1:0")
    assert PeerChannel.from_settings("auto", None, REMOTE) is None
    assert PeerChannel.from_settings("off", None, LOCAL) is None


def test_curve_is_required_off_loopback(tmp_path):
    with pytest.raises(CurveError, match="--kv-peer-bind"):
        PeerChannel.from_settings("tcp://0.0.0.0:0", None, LOCAL)
    _, secret = generate_keypair(tmp_path, "kv")
    assert PeerChannel.from_settings("tcp://0.0.0.0:0", secret, LOCAL).key == secret
    with pytest.raises(SystemExit):  # the worker's flags refuse it too
        load_settings(build_parser(), ["--kv-peer-bind", "tcp://0.0.0.0:7000"])
    _, worker, _ = load_settings(build_parser(), ["--kv-peer-bind", "off"])
    assert worker.kv_peer_bind == "off"


def test_a_wildcard_bind_advertises_the_host():
    assert advertised("tcp://0.0.0.0:7000").endswith(":7000")
    assert "0.0.0.0" not in advertised("tcp://0.0.0.0:7000")
    assert advertised("tcp://127.0.0.1:7000") == "tcp://127.0.0.1:7000"


def test_curve_channel_serves_key_holders_only(tmp_path):
    _, secret = generate_keypair(tmp_path, "kv")
    _, other = generate_keypair(tmp_path, "other")
    channel = PeerChannel("tcp://127.0.0.1:0", secret)
    ctx = zmq.Context()
    server = PeerServer(ctx, channel.bind, lambda: None, channel.configure_server)
    server.start()
    try:
        reply = ask(ctx, server.endpoint, Probe("p", 10), 5.0, channel.configure_client)
        assert isinstance(reply, ProbeReply) and len(reply.payload) == 10
        stranger = PeerChannel("tcp://127.0.0.1:0", other)
        with pytest.raises(PeerUnreachable):
            ask(ctx, server.endpoint, Probe("p", 10), 0.5, stranger.configure_client)
        with pytest.raises(PeerUnreachable):  # plain text to a CURVE server
            ask(ctx, server.endpoint, Probe("p", 10), 0.5)
    finally:
        server.stop()
        ctx.destroy(linger=0)
