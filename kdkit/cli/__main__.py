"""`python -m kdkit.cli ...` is the `kdkit` command."""
import sys

from . import main

sys.exit(main())
