"""``python -m diffpipe``: the same as the ``diffpipe`` command."""

import sys

from .cli import main

sys.exit(main())
