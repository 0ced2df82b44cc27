"""`python -m kdkit ...` is the `kdkit` command, for hosts where the package is on PYTHONPATH but not installed."""
import sys

from .cli import main

sys.exit(main())
