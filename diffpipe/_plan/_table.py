"""``PlanTable``: what ``plan`` found (rows fastest first, rejections, timings), its exports and
outputs, and the ranking of its rows (``ranked``: ties within ``TIE`` by memory)."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from typing import Any

from .. import schedules
from .._checks import is_int
from .._engine._communication import AbstractCommunication
from .._errors import ConfigError, ScheduleError
from .._machine._cluster import Cluster
from .._model._transformer import Transformer
from .._results import csv_text, json_text, markdown_table, percent
from .._workload._frameworks import Framework
from .._workload._parallelism import Parallelism
from ._configuration import HEADROOM, Configuration, fit_rule
from ._export import Launch, megatron_args, megatron_overlap_args, torchtitan_config, torchtitan_toml

#: Step times within this relative distance of the fastest of their run are a tie, ranked by memory
#: per GPU, then by GPUs per model replica (tensor x pipeline): a row 0.05% faster for 20 GB more
#: memory is not the one a practitioner picks, and the simulator is not that accurate.
TIE = 1e-3
#: The Markdown table's legend (its units and what ``comm`` and ``bubble`` are).
LEGEND = ("step: seconds per optimizer step; MFU: model FLOPs over the GPUs' dense BF16 peak (%); mem/GPU: the peak "
          "over pipeline ranks (GB, 10^9 bytes); bubble: share of the step a GPU idles (%; pipeline fill and drain, "
          "and the gradient sync and optimizer step the backward does not hide); comm: share of the step in the "
          "tensor-, context- (the K,V ring, beyond the attention it overlaps), expert- and ZeRO-3 collectives inside "
          "ops (%); cp: context-parallel size; family '-': no pipeline (PP1)")

COLUMNS = ("family", "tensor", "context", "pipeline", "data", "virtual", "expert", "expert_tensor", "microbatch_size",
           "microbatches",
           "recompute", "zero", "sequence_parallel", "layers_per_stage", "balanced", "step_time",
           "tokens_per_second_per_gpu", "mfu", "memory_per_gpu", "capacity", "bubble_ratio",
           "communication_share", "bound")


@dataclass(frozen=True)
class PlanTable:
    """What ``plan`` found: the evaluated configurations, fastest first, and the rejections.

    Attributes:
        rows: one dict per evaluated configuration that fits (``COLUMNS``; seconds, bytes), sorted
            by ``step_time``; balanced splits (``balanced=True``) are rows of their own. ``bound`` is
            the closed-form lower bound on the step time of the uniform split (module docstring).
        rejected: reason -> count (``tensor``, ``batch``, ``stages``, ``schedule``, ``memory``,
            ``memory (simulated)``, ``bound``).
        explored: configurations enumerated (every combination of the search axes).
        simulated: configurations the exact simulator evaluated.
        seconds: wall time per phase: ``enumerate`` (enumeration and closed forms), ``evaluate``
            (of which ``graphs``: schedule compilation, ``hardware``: building each member's
            ``Hardware``, ``simulate``: the batched exact simulation, its XLA compilation included),
            ``balance``, ``total``.
        model, cluster, global_batch: the request.
        communication, headroom: the pipeline's communication mode and the memory kept free.
        framework: the ``Framework`` every row was priced for (None: nothing overlapped); its
            Megatron-LM overlap flags go with ``megatron_args``.
    """

    rows: tuple[dict[str, Any], ...]
    rejected: dict[str, int]
    explored: int
    simulated: int
    seconds: dict[str, float]
    model: Transformer
    cluster: Cluster
    global_batch: int
    communication: str | AbstractCommunication = "overlap"
    headroom: float = HEADROOM
    framework: Framework | None = None

    @property
    def best(self) -> dict[str, Any]:
        """The fastest configuration that fits (within ``TIE`` of the fastest evaluated one, the
        least memory among those)."""
        return self.rows[0]

    def _row(self, i: Any) -> dict[str, Any]:
        if not is_int(i) or not -len(self.rows) <= i < len(self.rows):
            raise ConfigError(f"plan table: row i must be an integer in [0, {len(self.rows)}), got {i!r}")
        return self.rows[i]

    def model_of(self, i: int = 0) -> Transformer:
        """The ``Transformer`` of row ``i`` (its microbatch size and recomputation)."""
        row = self._row(i)
        return dataclasses.replace(self.model, microbatch_size=row["microbatch_size"], recompute=row["recompute"])

    def megatron_args(self, i: int = 0) -> list[str]:
        """Row ``i`` as Megatron-LM arguments, the model's shape included (``megatron_args``), as priced:
        the framework's overlap flags and attention kernel (``Framework.model``)."""
        model = self.model_of(i)
        if self.framework is not None:
            model = self.framework.model(model)
        return megatron_args(self.launch(i), model) + megatron_overlap_args(self.framework, self.parallelism(i))

    def export(self, framework: str, *, torchtitan_base: str | None = None) -> tuple[int, str]:
        """``(row, text)``: the fastest row ``framework`` runs (``megatron``: its arguments, the
        model's shape included, one shell line; ``torchtitan``: a Python configuration for torchtitan's
        current main, set on the model's own torchtitan configuration ``torchtitan_base``
        (``"module:function"``, ``torchtitan_config``); ``torchtitan-v0.2``: the TOML of torchtitan
        v0.2.0-v0.2.2; ``csv``: the torch CSV of the schedule) and that export; ``ConfigError`` naming
        the first refusal when no row exports."""
        exporters = {"megatron": lambda i: shlex.join(self.megatron_args(i)) + "\n",
                     "torchtitan": lambda i: torchtitan_config(self.launch(i), torchtitan_base),
                     "torchtitan-v0.2": lambda i: torchtitan_toml(self.launch(i)),
                     "csv": lambda i: schedules.to_torch_csv(self.configuration(i).schedule())}
        if framework not in exporters:
            raise ConfigError(f"plan table: export format must be one of {', '.join(exporters)}, got {framework!r}")
        if framework == "torchtitan" and torchtitan_base is None:
            raise ConfigError("plan table: the torchtitan export sets the plan on the model's own torchtitan "
                              "configuration: give torchtitan_base='module:function' (dp.TORCHTITAN_BASES has "
                              "the presets'), or export 'torchtitan-v0.2' (TOML)")
        first = None
        for i in range(len(self.rows)):  # e.g. Megatron-LM runs no zb-h1: the fastest row it runs
            try:
                return i, exporters[framework](i)
            except (ConfigError, ScheduleError) as error:
                first = first or error
        raise ConfigError(f"plan: no evaluated configuration exports to {framework} ({first})")

    def configuration(self, i: int = 0) -> Configuration:
        """Row ``i`` as a ``Configuration`` (``.evaluate()`` reproduces its numbers)."""
        row = self._row(i)
        model = self.model_of(i)
        return Configuration(model, self.parallelism(i), self.cluster, self.global_batch, schedule=row["family"],
                             communication=self.communication, layers_per_stage=row["layers_per_stage"],
                             framework=self.framework)

    def parallelism(self, i: int = 0) -> Parallelism:
        """The ``Parallelism`` of row ``i``."""
        row = self._row(i)
        sizes = {f.name: row[f.name] for f in dataclasses.fields(Parallelism) if f.name in row}
        if sizes.get("expert_tensor") == row["tensor"]:
            sizes["expert_tensor"] = None  # the default: the tensor size
        return Parallelism(**sizes)

    def launch(self, i: int = 0) -> Launch:
        """Row ``i`` as a ``Launch`` (for ``megatron_args`` / ``torchtitan_config`` / ``torchtitan_toml``)."""
        row = self._row(i)
        return Launch(row["family"], self.parallelism(i), microbatch_size=row["microbatch_size"],
                      global_batch=self.global_batch, sequence=self.model.sequence,
                      layers_per_stage=row["layers_per_stage"], recompute=row["recompute"])

    def to_dict(self) -> dict[str, Any]:
        return {"global_batch": self.global_batch, "gpus": self.cluster.gpus,
                "framework": "none" if self.framework is None else self.framework.name, "explored": self.explored,
                "simulated": self.simulated, "rejected": dict(self.rejected), "seconds": dict(self.seconds),
                "rows": [dict(r, layers_per_stage=list(r["layers_per_stage"])) for r in self.rows]}

    def to_json(self, path: Any = None, indent: int | None = 2) -> str:
        return json_text(self.to_dict(), path, indent)

    def to_csv(self, path: Any = None) -> str:
        rows = [[" ".join(map(str, r[c])) if c == "layers_per_stage" else r[c] for c in COLUMNS] for r in self.rows]
        return csv_text(COLUMNS, rows, path)

    def cells(self, top: int | None = 10) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        """The header and cells of the first ``top`` rows (all when None), as ``to_markdown`` shows them."""
        header = ("family", "tp", "cp", "pp", "dp", "v", "ep", "mbs", "recompute", "zero", "sp", "step (s)",
                  "tok/s/GPU", "MFU (%)", "mem/GPU (GB)", "bubble (%)", "comm (%)")
        cells = []
        for r in self.rows[: top if top is not None else len(self.rows)]:
            family = ("-" if r["pipeline"] == 1 else r["family"]) + (" (balanced)" if r["balanced"] else "")
            et = r.get("expert_tensor", r["tensor"])
            ep = r["expert"] if et == r["tensor"] else f"{r['expert']} (etp {et})"
            cells.append((family, r["tensor"], r.get("context", 1), r["pipeline"], r["data"], r["virtual"], ep,
                          r["microbatch_size"], r["recompute"], r["zero"], "y" if r["sequence_parallel"] else "n",
                          f"{r['step_time']:.3f}", f"{r['tokens_per_second_per_gpu']:.0f}", percent(r['mfu']),
                          f"{r['memory_per_gpu'] / 1e9:.1f}", percent(r['bubble_ratio']),
                          percent(r['communication_share'])))
        return header, cells

    def to_markdown(self, top: int | None = 10) -> str:
        """The first ``top`` rows (all when None) and the rejection counts, as Markdown."""
        return markdown_table(*self.cells(top)) + "\n" + self.notes()

    def notes(self) -> str:
        """What follows the table: the columns' legend, the fit rule, the counts and the rejections."""
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.rejected.items()))
        return (f"{LEGEND}; {fit_rule(self.cluster.device.memory, self.headroom)}\n{self.explored} configurations "
                f"explored, {self.simulated} simulated; rejected: {reasons or 'none'}\n")


def ranked(rows: list[dict]) -> list[dict]:
    """Rows fastest first; step times within ``TIE`` of the first of their run are ranked by memory
    per GPU, then by tensor x pipeline (GPUs per model replica)."""
    rows = sorted(rows, key=lambda r: r["step_time"])
    out: list[dict] = []
    while rows:
        head = rows[0]["step_time"]
        n = next((i for i, r in enumerate(rows) if r["step_time"] > head * (1 + TIE)), len(rows))
        out += sorted(rows[:n], key=lambda r: (r["memory_per_gpu"], r["tensor"] * r["pipeline"], r["step_time"]))
        rows = rows[n:]
    return out


__all__ = ["COLUMNS", "LEGEND", "TIE", "PlanTable", "ranked"]
