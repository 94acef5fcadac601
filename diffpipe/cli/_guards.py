"""Size limits checked from the sizes alone, before anything is generated or compiled (``--max-ops``)."""


from __future__ import annotations

from typing import Any

from .. import schedules
from .._errors import ConfigError, ScheduleError

#: The most operations one command may generate (the library's limit, ``schedules.MAX_OPS``),
#: estimated from its sizes before anything is built (``estimated_ops``); ``--max-ops`` raises or
#: lowers it. At the default, the largest single 1F1B schedule allowed (64 devices x 2048
#: microbatches) simulates in about 10 s on 2 CPU cores.
MAX_OPS = schedules.MAX_OPS
#: ``optimize`` counts its ops once per this many gradient steps: ops x steps / 3 <= ``--max-ops``
#: (measured on 2 CPU cores with examples/machine.toml at 300 steps: 1F1B 8 x 256 takes 40 s and
#: is allowed, 8 x 2048 took 160 s and is refused).
OPTIMIZE_STEPS_PER_OP = 3


# -- size guards -------------------------------------------------------------------------------------
def estimated_ops(family: str, devices: int, microbatches: int, options: dict[str, Any] | None = None) -> int:
    """The family's own estimate of its op count (``Family.estimate_ops``), from the sizes alone,
    before anything is generated; 0 where the request is invalid (generating it names the problem).
    Options the family does not have are left out (a sweep's grid spans several families)."""
    fam = schedules.family(family)  # an unknown family: one line naming it
    given = {k: v for k, v in (options or {}).items() if k in fam.option_names}
    try:
        resolved = fam.check(devices, microbatches, given)
    except ScheduleError:
        return 0
    return fam.estimate_ops(devices, microbatches, resolved)


def family_units(family: str, options: dict[str, Any] | None = None) -> int:
    """``Family.units`` (what ``schedules.units_per_sample`` reads off a generated schedule) from
    the sizes alone: microbatch ids per sample of ``family`` at ``options`` (those it declares;
    Seq1F1B's ``segments``), 1 where they are invalid: ``compare`` and ``sweep`` count samples."""
    fam = schedules.family(family)
    try:
        return fam.units({k: v for k, v in (options or {}).items() if k in fam.option_names})
    except ScheduleError:
        return 1


def _guard(detail: str, ops: int, max_ops: int) -> None:
    if ops > max_ops:
        raise ConfigError(f"{detail} is about {ops:,} ops, past the limit of {max_ops:,} (--max-ops); "
                          f"lower the sizes or pass --max-ops {ops}")


def _guard_schedule(family: str, devices: int, microbatches: int, options: dict[str, Any],
                    max_ops: int, factor: int = 1, why: str = "") -> None:
    ops = estimated_ops(family, devices, microbatches, options)
    if factor > 1:  # a family's one-time work (v-schedule's ranking) is done once, not per step
        fam = schedules.family(family)
        try:
            setup = fam.setup_estimate(devices, microbatches, fam.check(devices, microbatches, {
                k: v for k, v in options.items() if k in fam.option_names}))
        except ScheduleError:
            setup = 0
        ops = (ops - setup) * factor + setup
        factor = 1
    extra = "".join(f", {k}={v}" for k, v in options.items() if k in ("chunks", "waves", "steps"))
    detail = f"{family} on {devices} devices x {microbatches} microbatches{extra}{why}"
    _guard(detail, max(ops * factor, devices * devices), max_ops)


def _guard_configuration(cfg: Any, max_ops: int) -> None:
    options = dict(cfg.options)
    if "chunks" in schedules.family(cfg.family).option_names:
        options["chunks"] = cfg.parallelism.virtual
    _guard_schedule(cfg.family, cfg.parallelism.pipeline, cfg.microbatches, options, max_ops)

