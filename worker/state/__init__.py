"""Recurrent layers' state (linear attention, state space, short convolutions): one slot per
running sequence and snapshots at block boundaries for prefix caching (`StatePool`)."""

from worker.state.pool import StatePool
from worker.state.slot_arrays import StateShape

__all__ = ["StatePool", "StateShape"]
