"""``python -m pycudnnrnn``: the command line (see ``pycudnnrnn.tools.cli``)."""

import sys

from .tools.cli import main

sys.exit(main())
