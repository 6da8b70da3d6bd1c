"""``python -m pycudnnrnn``: the command line (see :mod:`pycudnnrnn.cli`)."""

import sys

from .cli import main

sys.exit(main())
