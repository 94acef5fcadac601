"""The compiled level scan stays on one thread: no per-level operation is split over threads.

XLA:CPU splits a fusion into parallel tasks when its operands are large (``outer_dimension_partitions``
in the compiled HLO); inside the level scan that meant a thread hand-off at every level once a
graph passed about 500 nodes (``diffpipe/_evaluate.py``, ``_take``). A structural check on the
compiled HLO, independent of timing and load.
"""

import re

import jax
import jax.numpy as jnp
import pytest

import diffpipe as dp
from diffpipe._engine._evaluate import BATCH_CHUNK, batched_makespan


def _computations(hlo: str) -> dict[str, str]:
    """Computation name -> its body text."""
    out, name, lines = {}, None, []
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%(\S+) ", line)
        if head and line.rstrip().endswith("{"):
            name, lines = head.group(1), []
        elif line.startswith("}") and name is not None:
            out[name], name = "\n".join(lines), None
        elif name is not None:
            lines.append(line)
    return out


def _level_bodies(hlo: str) -> list[str]:
    """Bodies of the innermost while loops (the level scans)."""
    computations = _computations(hlo)
    bodies = {m for text in computations.values() for m in re.findall(r"while\(.*?body=%([\w.\-]+)", text)}
    return [computations[b] for b in bodies if " while(" not in computations[b]]


@pytest.mark.parametrize("tau", [None, 0.05])
def test_level_scan_is_not_split_over_threads(tau):
    schedule = dp.schedules.get("1f1b", devices=8, microbatches=256)  # 4k nodes: split before the fix
    graph = dp.compile(schedule)
    x = jnp.linspace(0.5, 2.0, 2 * BATCH_CHUNK)
    hws = jax.vmap(lambda v: dp.Hardware.from_times(v * jnp.ones(schedule.stages), 2 * v, p2p_time=0.1))(x)
    tables = jax.vmap(lambda h: h.tables(graph))(hws).batch_last(batched=True)

    def value(t):
        return jnp.sum(batched_makespan(graph, t, None if tau is None else jnp.asarray(tau)))

    programs = {"forward": value}
    if tau is not None:
        programs["jvp"] = lambda t: jax.jvp(value, (t,), (t,))[1]
    for name, fn in programs.items():
        hlo = jax.jit(fn).lower(tables).compile().as_text()
        bodies = _level_bodies(hlo)
        assert bodies, name
        for body in bodies:
            split = [line.strip()[:120] for line in body.splitlines() if "outer_dimension_partitions" in line]
            assert not split, (name, split)
