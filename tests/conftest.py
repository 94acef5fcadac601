"""Test configuration: loud failures on silent broadcasting or dtype promotion, deterministic hypothesis."""

import os

import pytest
from hypothesis import HealthCheck, settings

# The suite never writes into the user's compilation cache (the CLI and the examples keep one by
# default): off for this process and every command it starts; tests of the cache give a folder.
os.environ["DIFFPIPE_CACHE"] = "0"
os.environ.pop("DIFFPIPE_CACHE_DIR", None)
# Most of the suite's time is XLA compiling fresh programs, and most of that is LLVM optimising
# code that then runs for milliseconds: XLA:CPU's back end at -O0 for this process and every
# command it starts (XLA's HLO passes still run; no fast math either way, the default). Measured
# against the default -O3 side by side: a fifth less compile time on the simulator and gradient
# tests, and no slower on the plan search and the examples, which run the most. An XLA_FLAGS
# naming the level itself is left as given.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
# A command's stderr is its one error line: the automatic progress of long commands
# (diffpipe._progress) stays off in the tests, which ask for it where it is the point.
os.environ.setdefault("DIFFPIPE_PROGRESS", "0")


def _count_compilations(folder: str) -> None:
    """``DIFFPIPE_COUNT_COMPILES=FOLDER``: each pytest process (the xdist workers too) writes the
    number of XLA compilations it ran and their seconds to ``FOLDER/<pid>.json`` at exit (JAX's
    backend-compile event, one per program ``JAX_LOG_COMPILES`` reports; the suite runs without
    the persistent cache, so each is a real compilation). The commands the tests start in
    subprocesses are not counted. Issue 21's "the suite's compile count"."""
    import atexit
    import json

    from jax import monitoring

    counted = {"compilations": 0, "seconds": 0.0}

    def listen(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            counted["compilations"] += 1
            counted["seconds"] += seconds

    monitoring.register_event_duration_secs_listener(listen)

    def write():
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
            json.dump(counted, f)

    atexit.register(write)


if os.environ.get("DIFFPIPE_COUNT_COMPILES"):
    _count_compilations(os.environ["DIFFPIPE_COUNT_COMPILES"])


@pytest.fixture(autouse=True, scope="session")
def _strict_jax():
    try:
        import jax
    except ImportError:  # the schedule layer needs no JAX
        yield
        return
    jax.config.update("jax_numpy_rank_promotion", "raise")
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    yield


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_executables():
    """Drop JAX's compiled executables after each test module. XLA:CPU maps about three memory
    regions per live executable; the whole suite compiles tens of thousands, which reached the
    kernel's ``vm.max_map_count`` (65,530) in one process and made XLA segfault while compiling."""
    yield
    try:
        import jax
    except ImportError:
        return
    jax.clear_caches()
