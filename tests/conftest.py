"""Test configuration: loud failures on silent broadcasting or dtype promotion, deterministic hypothesis."""

import os

import pytest
from hypothesis import HealthCheck, settings

# The suite never writes into the user's compilation cache (the CLI and the examples keep one by
# default): off for this process and every command it starts; tests of the cache give a folder.
os.environ["DIFFPIPE_CACHE"] = "0"
os.environ.pop("DIFFPIPE_CACHE_DIR", None)

settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
# A command's stderr is its one error line: the automatic progress of long commands
# (diffpipe._progress) stays off in the tests, which ask for it where it is the point.
os.environ.setdefault("DIFFPIPE_PROGRESS", "0")


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
