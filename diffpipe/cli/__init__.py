"""The ``diffpipe`` command: a thin shell over the public API.

``_args`` (argument types and shared flags), ``_inputs`` (flags and TOML files to library objects),
``_guards`` (size limits before any work), ``_outputs`` (tables, JSON, staged files), one module per
subcommand (``_list``, ``_show``, ``_simulate``, ``_compare``, ``_optimize``, ``_sweep``, ``_export``,
``_plan``, ``_calibrate``, ``_cache``: each a ``_cmd_<name>`` that reads its parsed arguments, calls the
library and prints) and ``_main`` (the parser, error lines and exit codes).
"""

from ._main import build_parser as build_parser
from ._main import main as main
