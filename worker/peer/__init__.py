"""Peer block transfer (issue 22): workers fetch prompts' KV blocks from one another over a
ZeroMQ channel of their own (shared/kv_transfer.py), and measure the links between them."""
