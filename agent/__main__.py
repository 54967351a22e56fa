"""Entry point for ``python -m agent``."""

import sys

from agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
