"""``python -m diffpipe``: the same as the ``diffpipe`` command."""

import sys

from .cli._main import main

sys.exit(main())
