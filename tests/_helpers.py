"""The tests' shared helpers: the schedule matrix (every registered family at one size) and the
command line run in-process (``run``, ``hf_config``).

The matrix is the registry: a family registered anywhere gets a case. ``SIZES`` pins the built-ins'
sizes; any other family takes the first size of ``SEARCH`` that its ``accepts`` allows. A family that
fails to build fails here, loudly: a broken family must not lose its tests.
"""

import contextlib
import io
import itertools
import json
import os

import diffpipe as dp
from diffpipe import cli

#: ``DIFFPIPE_FULL_MATRIX=1`` makes ``covering`` return the full product (all families x all modes).
FULL_MATRIX = os.environ.get("DIFFPIPE_FULL_MATRIX") == "1"

#: (devices, microbatches, options) per built-in family.
SIZES = {
    "gpipe": (3, 4, {}),
    "1f1b": (4, 6, {}),
    "interleaved-1f1b": (2, 4, {"chunks": 2}),
    "looped-bfs": (2, 3, {"chunks": 2}),
    "chimera": (4, 4, {}),
    "chimera-asymmetric": (4, 4, {}),
    "hanayo": (2, 2, {"waves": 2}),
    "zb-h1": (3, 4, {}),
    "zb-h2": (3, 4, {}),
    "zb-v": (2, 4, {}),
    "dualpipe-v": (2, 4, {}),
    "pipedream": (3, 6, {}),
    "pipedream-2bw": (2, 4, {}),
    "amdp": (4, 8, {}),
}
#: Sizes tried, in order, for a family not in ``SIZES``.
SEARCH = list(itertools.product((3, 4, 2, 8), (6, 8, 4, 16)))


def size(name):
    """(devices, microbatches, options) for family ``name``."""
    if name in SIZES:
        return SIZES[name]
    fam = dp.schedules.family(name)
    defaults = fam.resolve({})
    for d, n in SEARCH:
        if fam.accepts is None or fam.accepts(devices=d, microbatches=n, **defaults) is None:
            return d, n, {}
    raise AssertionError(f"{name}: accepts none of the test sizes {SEARCH}; add it to tests/_helpers.py SIZES")


def schedules():
    """(case id, schedule) for every registered family; a family that fails to build raises."""
    out = []
    for name in dp.schedules.names():
        devices, microbatches, options = size(name)
        s = dp.schedules.get(name, devices=devices, microbatches=microbatches, **options)
        out.append((f"{name}-{devices}x{microbatches}", s))
    return out


def covering(cases, modes, per_case=1):
    """(*case, mode) rows in which every case meets ``per_case`` modes and every mode meets about
    ``len(cases) * per_case / len(modes)`` cases, the modes rotating along the registry's order.

    The simulator's family-specific code (orders, dependencies) and its mode-specific code (edge
    costs, lanes) meet only in ``compile``, which the full product and this set exercise alike; the
    full product is the cost of ``len(modes) / per_case`` times the compilations.
    ``DIFFPIPE_FULL_MATRIX=1`` runs the full product instead."""
    if FULL_MATRIX:
        per_case = len(modes)
    return [(*case, modes[(i + k) % len(modes)]) for i, case in enumerate(cases) for k in range(per_case)]


# -- the command line, in-process ---------------------------------------------------------------------


def run(argv):
    """``(exit code, stdout, stderr)`` of ``diffpipe ARGV`` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def hf_config(tmp_path, config):
    """``config`` written as ``tmp_path/config.json`` (a Hugging Face config), its path."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path
