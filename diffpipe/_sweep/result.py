"""``SweepResult``: the table a sweep returns (numpy columns; CSV, JSON, Markdown; Pareto front, best).

No JAX here: a result can be read, filtered and written without the evaluator.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import ConfigError
from .._io import dumps_json, write_atomic

#: Columns of a ``SweepResult``, in table order.
COLUMNS = ("family", "options", "devices", "microbatches", "stages", "communication", "hardware", "makespan",
           "throughput", "bubble_ratio", "peak_memory", "fits")
THROUGHPUT_UNIT = "microbatches per second (sum of relative microbatch sizes / makespan)"


@dataclass(frozen=True, eq=False)
class SweepResult:
    """The table of a sweep: one row per evaluated (schedule, communication mode, hardware variant).

    Columns (numpy arrays of equal length, ``columns[name]``; also ``result[name]``):

    - ``family``, ``options`` (``"chunks=2"``-style, sorted, ``""`` for none), ``devices``,
      ``microbatches`` (all microbatches of the window: ``K * N`` for asynchronous schedules),
      ``stages``, ``communication``, ``hardware`` (index of the hardware variant);
    - ``makespan``: seconds of one step (of the unrolled window for asynchronous schedules), the
      exact simulator's value (``diffpipe.makespan``);
    - ``throughput``: microbatches per second, ``sum_m size[m] / makespan``: the hardware's
      relative microbatch sizes summed over every microbatch of the window (so with ``size = 1``,
      microbatches per step over the step time). Multiply by samples per microbatch for samples/s.
      Unlike the makespan it compares schedules with different microbatch counts or windows;
    - ``bubble_ratio``: idle fraction of ``devices x makespan`` (as ``diffpipe.simulate``);
    - ``peak_memory``: the largest per-device peak, bytes (static + stored activations);
    - ``fits``: whether every device's peak is within its ``capacity``.

    Attributes:
        skipped: one mapping per combination that was not evaluated (``family``, ``options``,
            ``devices``, ``microbatches``, ``communication``, ``reason``), e.g. a family rejecting a size.
        max_bytes: the memory bound per device the sweep was given; ``chunk_bytes`` the largest
            estimated per-device working memory of a chunk actually used (``<= max_bytes``).
        devices_used: JAX devices the chunks were sharded over; ``compiled``: stacks evaluated
            (each compiles one function); ``hardware_variants``: number of hardware variants.
    """

    columns: Mapping[str, np.ndarray]
    skipped: tuple[Mapping[str, Any], ...] = ()
    max_bytes: int = 0
    chunk_bytes: int = 0
    devices_used: int = 1
    compiled: int = 0
    hardware_variants: int = 0
    option_values: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return len(self.columns["makespan"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __repr__(self) -> str:
        return (f"SweepResult({len(self)} points, {len(self.skipped)} skipped, "
                f"{self.hardware_variants} hardware variants)")

    # -- selection ------------------------------------------------------------------------------
    def where(self, mask: Any) -> SweepResult:
        """The rows where ``mask`` (a boolean array over rows, or row indices) holds, in that order."""
        index = np.asarray(mask)
        if index.dtype == bool:
            if index.shape != (len(self),):
                raise ConfigError(f"where: mask has shape {index.shape}, the table has {len(self)} rows")
            index = np.flatnonzero(index)
        columns = {name: value[index] for name, value in self.columns.items()}
        return self._replace(columns)

    def filter(self, **equals: Any) -> SweepResult:
        """Rows whose columns equal the given values, e.g. ``filter(family="1f1b", hardware=0)``."""
        mask = np.ones(len(self), dtype=bool)
        for name, value in equals.items():
            if name not in self.columns:
                raise ConfigError(f"filter: no column {name!r}; columns: {', '.join(COLUMNS)}")
            mask &= self.columns[name] == value
        return self.where(mask)

    def rows(self) -> list[dict[str, Any]]:
        """Every row as a dict of plain Python values (``options`` as a dict when known)."""
        header = self._header()
        values = {name: self.columns[name].tolist() for name in header}
        entry = self.columns["_entry"].tolist() if "_entry" in self.columns and self.option_values else None
        out = []
        for i in range(len(self)):
            row = {name: values[name][i] for name in header}
            if entry is not None:
                row["options"] = dict(self.option_values[entry[i]])
            out.append(row)
        return out

    def _replace(self, columns: Mapping[str, np.ndarray]) -> SweepResult:
        return SweepResult(columns, self.skipped, self.max_bytes, self.chunk_bytes, self.devices_used,
                           self.compiled, self.hardware_variants, self.option_values)

    # -- analysis ---------------------------------------------------------------------------------
    def _time(self, metric: str) -> np.ndarray:
        """A cost to minimise: the makespan, or the time per microbatch (``1 / throughput``)."""
        if metric == "makespan":
            return self.columns["makespan"].astype(np.float64)
        if metric == "throughput":
            return -self.columns["throughput"].astype(np.float64)
        raise ConfigError(f"metric {metric!r} is not 'throughput' or 'makespan'")

    def pareto(self, *, metric: str = "throughput", per_hardware: bool = True) -> SweepResult:
        """The points no other point beats in both time and ``peak_memory``.

        A point is dominated when another has no more time and no more memory, and strictly less of
        one. ``metric="throughput"`` (default) measures time per microbatch (``1 / throughput``),
        which compares schedules with different microbatch counts; ``"makespan"`` the step time.
        With ``per_hardware`` (default) the front is taken within each hardware variant (a schedule
        is chosen for a machine); otherwise over all rows. Sorted by hardware, then time.
        """
        time = self._time(metric)
        memory = self.columns["peak_memory"].astype(np.float64)
        groups = self.columns["hardware"] if per_hardware else np.zeros(len(self), dtype=np.int64)
        order = np.lexsort((memory, time, groups))
        keep = []
        current, best_memory, best_time = None, math.inf, math.inf
        for i in order.tolist():
            if groups[i] != current:
                current, best_memory, best_time = groups[i], math.inf, math.inf
            if memory[i] < best_memory or (memory[i] == best_memory and time[i] == best_time):
                keep.append(i)
                best_memory, best_time = memory[i], time[i]
        return self.where(np.asarray(keep, dtype=np.int64))

    def best(self, k: int = 1, *, metric: str = "throughput", fits_only: bool = True) -> SweepResult:
        """The ``k`` best points of every hardware variant, ranked (a ``rank`` column, 1 = best).

        Ranked by highest throughput (default) or lowest makespan, ties by lower peak memory, then
        table order. With ``fits_only`` (default) only points whose memory fits are ranked; a
        variant on which nothing fits has no rows.
        """
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"best: k must be a positive int, got {k!r}")
        time = self._time(metric)
        memory = self.columns["peak_memory"].astype(np.float64)
        hardware = self.columns["hardware"]
        candidates = np.flatnonzero(self.columns["fits"]) if fits_only else np.arange(len(self))
        order = candidates[np.lexsort((candidates, memory[candidates], time[candidates], hardware[candidates]))]
        picked, ranks = [], []
        previous, rank = None, 0
        for i in order.tolist():
            rank = rank + 1 if hardware[i] == previous else 1
            previous = hardware[i]
            if rank <= k:
                picked.append(i)
                ranks.append(rank)
        out = self.where(np.asarray(picked, dtype=np.int64))
        columns = dict(out.columns)
        columns["rank"] = np.asarray(ranks, dtype=np.int32)
        return out._replace(columns)

    # -- formats ----------------------------------------------------------------------------------
    def _header(self) -> list[str]:
        return [*COLUMNS, "rank"] if "rank" in self.columns else list(COLUMNS)

    def to_dict(self) -> dict[str, Any]:
        """``{"columns", "points": [row dicts], "skipped", "max_bytes", "chunk_bytes", ...}`` as plain
        Python values (``options`` as a dict)."""
        return {
            "columns": self._header(), "points": self.rows(), "skipped": [dict(s) for s in self.skipped],
            "max_bytes": self.max_bytes, "chunk_bytes": self.chunk_bytes, "devices_used": self.devices_used,
            "compiled": self.compiled, "hardware_variants": self.hardware_variants,
            "throughput_unit": THROUGHPUT_UNIT,
        }

    def to_json(self, path: Any = None) -> str:
        """``to_dict`` as strict JSON (undefined numbers as ``null``). Written atomically to ``path``
        when given; the text is returned either way."""
        text = dumps_json(self.to_dict(), indent=1)
        if path is not None:
            write_atomic(path, text)
        return text

    def to_csv(self, path: Any = None) -> str:
        """The table as CSV (header row, one row per point; floats at full precision). Written
        atomically to ``path`` when given; the text is returned either way."""
        header = self._header()
        values = [self.columns[c].tolist() for c in header]
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(zip(*values))
        text = buffer.getvalue()
        if path is not None:
            write_atomic(path, text)
        return text

    def to_markdown(self, limit: int | None = None) -> str:
        """A GitHub-flavoured Markdown table (first ``limit`` rows when given), then the skipped
        combinations as a list."""
        header = self._header()
        rows = self.columns
        n = len(self) if limit is None else min(limit, len(self))
        titles = [_TITLES.get(c, c) for c in header]
        lines = ["| " + " | ".join(titles) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for i in range(n):
            cells = [_format(c, rows[c][i]) for c in header]
            lines.append("| " + " | ".join(cells) + " |")
        if n < len(self):
            lines.append(f"\n({len(self) - n} more rows)")
        if self.skipped:
            lines.append("\nSkipped:\n")
            for s in self.skipped:
                what = " ".join(f"{k}={s[k]}" for k in ("family", "options", "devices", "microbatches",
                                                         "communication") if s.get(k) not in (None, ""))
                lines.append(f"- {what}: {s['reason']}")
        return "\n".join(lines) + "\n"


#: The Markdown table's column titles, with their units (the columns themselves stay in SI units).
_TITLES = {"makespan": "makespan (s)", "throughput": "microbatches/s", "peak_memory": "peak memory (GB)",
           "bubble_ratio": "bubble (%)"}


def _format(column: str, value: Any) -> str:
    if column in ("makespan", "throughput"):
        return f"{float(value):.6g}"
    if column == "bubble_ratio":
        return f"{100 * float(value):.2f}"
    if column == "peak_memory":
        return f"{float(value) / 1e9:.4g}"
    text = str(value)
    return text.replace("|", "\\|") if text else "-"
