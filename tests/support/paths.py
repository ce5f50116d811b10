"""Where the repository is, for tests that run its scripts or read its docs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
