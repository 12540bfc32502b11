"""`python -m panamera ...` is the `panamera` command (panamera/cli.py), for an environment whose
scripts directory is not on PATH."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
