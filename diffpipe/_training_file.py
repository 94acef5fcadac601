"""A machine file's training configuration (``[training]``, ``[parallelism]``, ``[cluster]``,
``[schedule]``; ``examples/llama3-70b.toml``) as its ``Configuration``: ``configuration``. Apart
from ``_machine_file`` so that the commands of a machine do not load the planner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from . import schedules
from ._plan._configuration import Configuration
from .calibrate._calibration import communication_mode


def configuration(model: Any, parallelism: Any, cluster: Any, global_batch: int, *, family: str | None = None,
                  options: Mapping[str, Any] | None = None, communication: Any = "overlap", framework: str = "none",
                  placed_stages: bool = False, check: Callable[[Any], None] | None = None) -> Any:
    """The ``Configuration`` of a training configuration (``[training]``, ``[parallelism]``,
    ``[cluster]``, ``[schedule]``); ``communication`` any mode name, ``"torch-runtime"`` included.

    ``check(configuration)`` runs before anything builds its schedule (the command line's size
    guard). ``placed_stages``: a family without chunks keeps the stages it places (``virtual`` = its
    stages per device), as ``compare`` runs every family on one split of the model.
    """
    mode = communication_mode(communication)

    def make(par: Any) -> Any:
        return Configuration(model, par, cluster, global_batch, schedule=family, options=options,
                             communication=mode, framework=framework)

    cfg = make(parallelism)
    if check is not None:
        check(cfg)
    if placed_stages and "chunks" not in schedules.family(cfg.family).option_names:
        stages = schedules.get(cfg.family, devices=parallelism.pipeline, microbatches=cfg.microbatches,
                               **dict(cfg.options)).stages
        cfg = make(dataclasses.replace(parallelism, virtual=max(1, stages // parallelism.pipeline)))
    return cfg


__all__ = ["configuration"]
