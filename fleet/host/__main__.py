import sys

from fleet.host.cli import main

sys.exit(main())
