"""`python scripts/soak.py ...`: the soak run (scripts/soak/cli.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from scripts.soak.cli import main  # noqa: E402

sys.exit(main())
