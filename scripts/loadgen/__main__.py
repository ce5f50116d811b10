"""`python scripts/loadgen ...` or `python -m scripts.loadgen ...` (from the repository root)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from scripts.loadgen.cli import main  # noqa: E402

sys.exit(main())
