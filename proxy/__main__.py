"""`python -m proxy` runs the command line."""

import sys

from proxy.running.cli import main

sys.exit(main())
