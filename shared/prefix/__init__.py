"""What router and worker agree on about cached prefixes: how much of a match is a usable hit
(hit_rule.py). Block hashes themselves are shared/hashing.py."""

from shared.prefix.hit_rule import HitRule

__all__ = ["HitRule"]
