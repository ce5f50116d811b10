"""`python scripts/compare.py ...`: the comparison runner (scripts/loadgen/compare.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from scripts.loadgen.compare import main  # noqa: E402

sys.exit(main())
