"""`python -m worker`: the same as `cluster-worker`."""

import sys

from worker.cli import main

sys.exit(main())
