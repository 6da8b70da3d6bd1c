"""``python -m pycudnnrnn``: the command line (see ``pycudnnrnn.cli``)."""

import sys

from .cli import main

sys.exit(main())
