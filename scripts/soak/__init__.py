"""The soak run (`python scripts/soak.py`): mixed load and faults against launch-cluster."""
