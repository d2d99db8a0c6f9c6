"""Command line: `python -m kvlab bench <name> [options] [--json PATH]` (see kvlab.bench.cli)."""

import sys

from kvlab.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
