"""``Calibration``: per-stage op times and per-op costs measured on a real machine, and the
``Hardware`` (or machine file) that predicts schedules from them.

Terms (seconds):

- ``forward[s]``, ``backward[s]``, ``input_grad[s]``, ``weight[s]``: the compute time of one
  microbatch's ``F``, full backward ``B``, input-gradient backward ``I`` and weight-gradient
  backward ``W`` on stage ``s`` (``None`` where not measured). As everywhere else in diffpipe,
  ``backward`` here is the *full* backward as torch runs it; torch's split ``I + W`` may cost more
  than a full ``B`` (and on stage 0 torch runs the whole backward in ``W``: its ``I`` is empty).
- ``overhead``: the framework time between two consecutive compute ops of a rank when the second
  does not wait for data (the schedule loop, building and posting the P2P ops); diffpipe adds it
  to every op. ``overhead_by_kind`` is the same mean by the kind of the second op (``F``, ``B``,
  ``I``, ``W``): ``hardware`` gives it as ``Hardware.kind_overhead`` (kinds without a sample take
  ``overhead``).
- ``send_cost`` / ``recv_cost``: the host (CPU/DMA) time one cross-device transfer costs the
  rank that sends it / receives it (posting the send, posting and completing the receive), which
  a trace times directly (torch's ``SEND_*``/``RECV_*`` action labels); the cost model adds them
  to the op that produces / consumes each transfer (``Hardware.send_cost`` / ``recv_cost``), and
  the gaps that give ``overhead`` are taken less them.
- ``p2p``: the delay of one transfer beyond the overhead and those host times (diffpipe's
  ``p2p_time``); ``transfer`` the raw delay from the producing op's end to the data's arrival.
- ``setup`` / ``wind_down``: the time of a step before its first compute op (past one overhead)
  and after its last one: ``Hardware.setup`` / ``wind_down``.

A schedule that splits its backward gets the measured full backward, where measured, as
``Hardware.full_backward`` (its ``B`` ops then cost that, not ``I + W``).

From a run of full backwards only (GPipe, 1F1B, interleaved 1F1B, looped BFS) the ``I``/``W``
split is not measured. ``backward_split[s]`` supplies it without guessing: the ratios
``(I / B, W / B)`` of stage ``s``, from the model's FLOPs (``with_split(model=...)``: ``W`` is the
weight matmuls' share of the backward, ``I + W = B``) or from a measured probe of the same torch
modules (``with_split(probe=profile_stages(...))``: torch's own ``stage_backward_input`` and
``stage_backward_weight`` against its full backward, so the ratios also carry how much more a
split backward costs than a full one). Without it (and without ``weight_fraction=``), a
``Hardware`` of such a calibration has ``split_known=False`` and refuses ``I``/``W`` ops.

Why one module past 500 lines: ``Calibration``, the three things it writes (a ``Hardware`` or
``Workload``, JSON, the TOML machine file) and its two other constructors (``combine``,
``from_measurements``) share the per-stage terms and the backward split above; reading a trace into
one is ``_trace``'s.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .._checks import check_int, check_moved, check_number
from .._engine._hardware import Hardware, Network
from .._engine._simulate import simulate
from .._errors import ConfigError
from .._io import dumps_json, toml_value, write_atomic
from .._model._transformer import Transformer, layer_costs, stage_of_layers
from .._workload._workload import Workload
from ._runtime import TorchRuntime

#: Where ``hardware``/``workload``'s ``mode=`` went (the graph owns the communication mode).
_MODE_MOVED = {"mode": "predict(mode=...) or compile/optimize(communication=...)"}

#: Calibration fields written to a machine file's ``[times]`` (the keys ``diffpipe --config`` reads).
TOML_TIMES = ("forward", "backward", "weight", "p2p", "overhead", "setup", "wind_down")
#: ``[times]`` keys written when measured (non-zero): the host time of a transfer on each side.
TOML_HOST = ("send_cost", "recv_cost")
#: The machine file's ``[times] backward`` (the CLI's key) is ``Hardware.input_grad``.
TIMES_KEYS = {"backward": "input_grad"}
#: ``[times]`` keys of the per-kind overheads (``Hardware.kind_overhead``), by kind.
TOML_KIND_OVERHEAD = {kind: f"overhead_{kind}" for kind in ("F", "B", "I", "W")}


def _stage_values(name: str, values: Any, stages: int | None) -> tuple[float | None, ...] | None:
    """``values`` (a number, or one per stage; ``None`` entries allowed) as a tuple of floats."""
    if values is None:
        return None
    if isinstance(values, (int, float)) and not isinstance(values, bool):
        if stages is None:
            raise ConfigError(f"calibration: {name} is a number; give one value per stage (or forward per stage)")
        values = [values] * stages
    if not isinstance(values, Sequence) or isinstance(values, str):
        raise ConfigError(f"calibration: {name} must be a number or one value per stage, got {values!r}")
    out = [None if v is None else check_number(f"calibration: {name}[{s}]", v) for s, v in enumerate(values)]
    if stages is not None and len(out) != stages:
        raise ConfigError(f"calibration: {name} has {len(out)} values, forward has {stages} stages")
    return tuple(out)


@dataclass(frozen=True)
class Calibration:
    """Measured per-stage op times and per-op costs (seconds); see the module docstring.

    ``orders`` (from a trace): the compute ops each rank ran in one step, as op strings
    (``"1F0"``); ``stage_ranks[s]`` the rank that held stage ``s``; ``samples`` the number of ops
    behind each mean (``"F1"`` -> 8); ``step_time`` the measured step (median over steps);
    ``spread`` the relative spread of each mean's samples (their standard deviation over their
    mean, gross outliers dropped as in ``robust_mean``; ``"F1"`` -> 0.03);
    ``residual`` how well the fit explains the trace: ``durations`` the median relative deviation
    of op times from their stage's median, ``step`` the relative error of ``predict`` on the traced
    schedule itself. ``source`` names where the numbers came from. ``backward_split[s]``: stage
    ``s``'s ``(I / B, W / B)`` where the split is not measured (module docstring; ``with_split``),
    ``split_source`` where those ratios came from.
    """

    forward: tuple[float, ...]
    backward: tuple[float | None, ...] | None = None
    input_grad: tuple[float | None, ...] | None = None
    weight: tuple[float | None, ...] | None = None
    overhead: float = 0.0
    overhead_by_kind: Mapping[str, float] = field(default_factory=dict)
    p2p: float = 0.0
    transfer: float | None = None
    setup: float = 0.0
    wind_down: float = 0.0
    send_cost: float = 0.0
    recv_cost: float = 0.0
    step_time: float | None = None
    stage_ranks: tuple[int, ...] | None = None
    orders: tuple[tuple[str, ...], ...] | None = None
    samples: Mapping[str, int] = field(default_factory=dict)
    residual: Mapping[str, float | None] = field(default_factory=dict)
    source: str = "measurements"
    spread: Mapping[str, float | None] = field(default_factory=dict)
    backward_split: tuple[tuple[float, float] | None, ...] | None = None
    split_source: str | None = None

    def __post_init__(self) -> None:
        forward = _stage_values("forward", self.forward, None)
        if not forward or any(v is None for v in forward):
            raise ConfigError("calibration: forward needs a time for every stage")
        object.__setattr__(self, "forward", forward)
        for name in ("backward", "input_grad", "weight"):
            object.__setattr__(self, name, _stage_values(name, getattr(self, name), len(forward)))
        for name in ("overhead", "p2p", "setup", "wind_down", "send_cost", "recv_cost"):
            object.__setattr__(self, name, check_number(f"calibration: {name}", getattr(self, name)))
        if self.backward is None and (self.input_grad is None or self.weight is None):
            raise ConfigError("calibration: give backward (full), or both input_grad and weight")
        if self.backward_split is not None:
            split = tuple(self.backward_split)
            if len(split) != len(forward):
                raise ConfigError(f"calibration: backward_split has {len(split)} entries, forward has "
                                  f"{len(forward)} stages")
            checked = []
            for s, pair in enumerate(split):
                if pair is None:
                    checked.append(None)
                    continue
                i, w = (check_number(f"calibration: backward_split[{s}]", v) for v in pair)
                if i + w <= 0:
                    raise ConfigError(f"calibration: backward_split[{s}] = {pair!r}: I + W must be > 0")
                checked.append((i, w))
            object.__setattr__(self, "backward_split", tuple(checked))

    @property
    def stages(self) -> int:
        return len(self.forward)

    # -- what the cost model takes ---------------------------------------------------------------------
    def _measured(self, name: str, s: int) -> float | None:
        values = getattr(self, name)
        return values[s] if values else None

    def _ratios(self, s: int) -> tuple[float, float] | None:
        return self.backward_split[s] if self.backward_split else None

    def split_known(self, weight_fraction: float | None = None) -> bool:
        """Whether every stage has an ``I``/``W`` split: measured, from ``backward_split`` times a
        measured ``B``, or from ``weight_fraction``."""
        for s in range(self.stages):
            if self._measured("input_grad", s) is not None and self._measured("weight", s) is not None:
                continue
            if self._measured("backward", s) is None or (weight_fraction is None and self._ratios(s) is None):
                return False
        return True

    def _split(self, weight_fraction: float | None) -> tuple[list[float], list[float]]:
        """Per-stage ``(I, W)`` for a schedule that splits its backward: measured, else the measured
        ``B`` split by ``weight_fraction`` (when given) or by ``backward_split``."""
        inputs, weights = [], []
        for s in range(self.stages):
            i, w, b = (self._measured(name, s) for name in ("input_grad", "weight", "backward"))
            if i is None or w is None:
                ratios = None if weight_fraction is None else (1 - weight_fraction, weight_fraction)
                ratios = ratios or self._ratios(s)
                if b is None or ratios is None:
                    raise ConfigError(
                        f"calibration: stage {s} has no measured I/W split (the trace ran a full backward); "
                        "calibrate from a zero-bubble schedule's trace, give the W share (from_torch_trace(..., "
                        "model= or probe=), Calibration.with_split) or pass weight_fraction="
                    )
                i, w = b * ratios[0], b * ratios[1]
            inputs.append(i)
            weights.append(w)
        return inputs, weights

    def _full(self, split: tuple[list[float], list[float]] | None = None) -> list[float]:
        """Per-stage full backward: measured ``B``, else ``I + W`` (the measured split, or
        ``split``), scaled by ``backward_split``'s ``B / (I + W)`` where given."""
        out = []
        for s in range(self.stages):
            b = self._measured("backward", s)
            if b is None:
                i = self._measured("input_grad", s) if split is None else split[0][s]
                w = self._measured("weight", s) if split is None else split[1][s]
                if i is None or w is None:
                    raise ConfigError(f"calibration: stage {s} has neither a full backward nor an I/W split")
                ratios = self._ratios(s)
                b = (i + w) / (ratios[0] + ratios[1]) if ratios else i + w
            out.append(b)
        return out

    def times(self, schedule: Any = None, *, weight_fraction: float | None = None) -> dict[str, Any]:
        """``Hardware.from_times`` arguments (``input_grad`` = ``I``) for ``schedule``.

        A schedule that splits its backward (any ``I``/``W`` op) gets the measured ``I`` and ``W``
        and, where measured, the full ``B`` as ``full_backward`` (what its ``B`` ops, if any, cost;
        else ``I + W``); one that runs only full backwards gets the measured ``B`` as
        ``input_grad`` and no ``W``. Without a schedule: the split where measured. Also the
        per-kind overheads (``kind_overhead``: ``overhead_by_kind``, None when not measured),
        ``setup``, ``wind_down``, ``send_cost`` and ``recv_cost``.
        ``weight_fraction`` splits a measured full ``B`` where no split was measured (else
        ``backward_split`` does). ``split``: whether ``input_grad``/``weight`` are the ``I``/``W``
        split (False: ``input_grad`` is the full ``B`` and ``weight`` 0, which must not price a
        schedule with ``I``/``W`` ops).
        """
        if schedule is not None:
            if schedule.stages != self.stages:
                raise ConfigError(
                    f"calibration: measured {self.stages} stages, the schedule has {schedule.stages}"
                )
            split = any(op.kind in ("I", "W") for order in schedule.orders for op in order)
        else:
            split = self.split_known(weight_fraction)
        full = None
        if split:
            backward, weight = self._split(weight_fraction)
            if (self.backward is not None and any(b is not None for b in self.backward)) or self.backward_split:
                full = self._full((backward, weight))
        else:
            backward, weight = self._full(), [0.0] * self.stages
        return {"forward": list(self.forward), "input_grad": backward, "weight": weight,
                "p2p": self.p2p, "overhead": self.overhead, "full_backward": full,
                "kind_overhead": dict(self.overhead_by_kind) or None, "setup": self.setup,
                "wind_down": self.wind_down, "send_cost": self.send_cost, "recv_cost": self.recv_cost,
                "split": split}

    def hardware(self, schedule: Any = None, *, weight_fraction: float | None = None, **moved: Any) -> Any:
        """A ``diffpipe.Hardware`` for ``schedule`` (any schedule of the calibration's stage count
        when None). The communication mode is the graph's: ``predict(mode=...)`` compiles under it
        (``"torch-runtime"`` is ``TorchRuntime``, the mode of torch's pipelining runtime over gloo).

        Where every stage has an ``I``/``W`` split (``split_known``), the hardware prices every
        kind: ``I``, ``W`` and, as ``full_backward``, the full ``B``; so one hardware serves
        every schedule. Else ``input_grad`` is the full ``B``, ``weight`` 0, and the hardware has
        ``split_known=False``: simulating a schedule with ``I``/``W`` ops on it raises, rather
        than pricing ``I`` as the whole backward and ``W`` as free.
        """
        check_moved("Calibration.hardware", moved, _MODE_MOVED)
        if schedule is not None and schedule.stages != self.stages:
            raise ConfigError(f"calibration: measured {self.stages} stages, the schedule has {schedule.stages}")
        known = self.split_known(weight_fraction)
        if not known:
            self.times(schedule, weight_fraction=weight_fraction)  # a split schedule: the error names the stage
        t = _explicit(self.times(None, weight_fraction=weight_fraction))
        return Hardware.from_times(t["forward"], t["input_grad"], t["weight"], t["p2p"],
                                   overhead=t["overhead"],
                                   kind_overhead=t["kind_overhead"], full_backward=t["full_backward"],
                                   setup=t["setup"], wind_down=t["wind_down"], split_known=known,
                                   send_cost=t["send_cost"], recv_cost=t["recv_cost"])

    def with_split(self, *, model: Any = None, layers_per_stage: Sequence[int] | None = None,
                   probe: Calibration | None = None) -> Calibration:
        """This calibration with ``backward_split``: each stage's ``(I / B, W / B)``, for the
        stages whose split was not measured (module docstring). Give one of:

        - ``model``, a ``diffpipe.Transformer``: the ratios of its FLOPs (``layer_costs``: a weight
          matmul's ``W`` costs its ``I``, attention's score and value products are all ``I``), its
          blocks grouped into the calibration's stages as ``stage_of_layers`` does (evenly, or
          ``layers_per_stage``); ``I + W = B``. Stage 0 as torch runs it: no input gradient, the
          whole backward in ``W`` (``(0, 1)``).
        - ``probe``, a ``Calibration`` from ``profile_stages`` of the same stages: its measured
          ``I / B`` and ``W / B`` (torch's split backward against its full one).
        """
        if (model is None) == (probe is None):
            raise ConfigError("calibration: with_split takes exactly one of model= or probe=")
        if model is not None:
            if not isinstance(model, Transformer):
                raise ConfigError(f"calibration: model must be a diffpipe.Transformer, got {type(model).__name__}")
            costs = layer_costs(model)
            where = stage_of_layers(model, None if layers_per_stage is not None else self.stages, layers_per_stage)
            if int(where.max()) + 1 != self.stages:
                raise ConfigError(f"calibration: layers_per_stage has {int(where.max()) + 1} stages, the "
                                  f"calibration {self.stages}")
            inputs = np.bincount(where, costs.input_grad, self.stages)
            weights = np.bincount(where, costs.weight, self.stages)
            split = [(0.0, 1.0) if s == 0 else (float(i / (i + w)), float(w / (i + w)))
                     for s, (i, w) in enumerate(zip(inputs, weights, strict=True))]
            source = f"model FLOPs ({model.layers} layers)"
        else:
            if not isinstance(probe, Calibration):
                raise ConfigError(f"calibration: probe must be a Calibration (profile_stages), got "
                                  f"{type(probe).__name__}")
            if probe.stages != self.stages:
                raise ConfigError(f"calibration: the probe timed {probe.stages} stages, the calibration has "
                                  f"{self.stages}")
            split = []
            for s in range(self.stages):
                b, i, w = (probe._measured(name, s) for name in ("backward", "input_grad", "weight"))
                if b is None or i is None or w is None or b <= 0:
                    raise ConfigError(f"calibration: the probe has no full backward and I/W split for stage {s}")
                split.append((i / b, w / b))
            source = f"probe ({probe.source})"
        return replace(self, backward_split=tuple(split), split_source=source)

    def workload(self, schedule: Any = None, *, layers: Sequence[int] | None = None,
                 weight_fraction: float | None = None, **moved: Any) -> Any:
        """A ``diffpipe.Workload`` (per-layer table) for ``StageBalance`` / ``optimize`` (whose
        ``communication=`` is the mode).

        ``layers[s]`` is the number of layers the measured stage ``s`` holds (default 1 each); each
        stage's times are spread evenly over its layers (the calibration cannot see inside a stage),
        and the measured split is the workload's ``layers_per_stage``. Times as in ``times``: where
        they are not the ``I``/``W`` split (a full-backward calibration without ``with_split`` or
        ``weight_fraction``, or a ``schedule`` without ``I``/``W`` ops) the workload has
        ``split_known=False``, so ``optimize``/``sweep``/``simulate`` of a schedule with ``I``/``W``
        ops on it raise rather than price ``I`` as the whole backward and ``W`` as free (build the
        workload for that schedule instead). The measured full backward (spread over the layers
        like the other times), the per-kind overheads, ``setup``, ``wind_down`` and the host times
        of a transfer are the workload's too, so its hardware at the measured split prices a
        schedule as ``predict``.
        """
        check_moved("Calibration.workload", moved, _MODE_MOVED)
        counts = [1] * self.stages if layers is None else [check_int("calibration: layers", n) for n in layers]
        if len(counts) != self.stages:
            raise ConfigError(f"calibration: layers has {len(counts)} entries, the calibration {self.stages} stages")
        t = _explicit(self.times(schedule, weight_fraction=weight_fraction))

        def spread(values: Sequence[float]) -> list[float]:
            return [v / n for v, n in zip(values, counts, strict=True) for _ in range(n)]

        network = Network.uniform(t["p2p"])
        return Workload.from_table(spread(t["forward"]), spread(t["input_grad"]), spread(t["weight"]),
                                   overhead=t["overhead"], network=network, layers_per_stage=counts,
                                   split_known=t["split"], full_backward=spread(t["full_backward"]),
                                   kind_overhead=t["kind_overhead"], setup=t["setup"], wind_down=t["wind_down"],
                                   send_cost=t["send_cost"], recv_cost=t["recv_cost"])

    def predict(self, schedule: Any, *, weight_fraction: float | None = None, mode: Any = "overlap") -> float:
        """Predicted step time of ``schedule`` compiled under ``mode`` (a communication mode or its
        name, ``"torch-runtime"`` included): the simulated makespan (``setup`` and ``wind_down``
        included: they are ``hardware``'s terms)."""

        result = simulate(schedule, self.hardware(schedule, weight_fraction=weight_fraction),
                          communication=communication_mode(mode))
        return float(result.makespan)

    # -- files -----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in asdict(self).items()}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """Strict JSON of ``to_dict``; written atomically to ``path`` when given."""
        text = dumps_json(self.to_dict())
        if path is not None:
            write_atomic(path, text, "calibration JSON")
        return text

    def to_toml_text(self, schedule: Any = None, *, weight_fraction: float | None = None,
                     mode: Any = "overlap") -> str:
        """A machine file for ``diffpipe --config``: ``[times]`` and ``[network] mode``.

        The times are ``hardware``'s (``schedule``, when given, is checked for the stage count):
        with an ``I``/``W`` split, ``backward`` is ``I``, ``weight`` is ``W`` and ``full_backward``
        the full ``B``, so one file prices every schedule; without one, ``backward`` is the full
        ``B``, ``weight`` 0 and ``split_known = false`` (the CLI then refuses a schedule with
        ``I``/``W`` ops). ``overhead_F`` ... ``overhead_W`` for the kinds measured, ``send_cost``
        and ``recv_cost`` where measured (non-zero); ``mode`` (a
        name or a communication mode; ``"torch-runtime"`` included) is ``[network] mode``. The
        step time, the residual and where the split came from are comments.
        """
        if schedule is not None and schedule.stages != self.stages:
            raise ConfigError(f"calibration: measured {self.stages} stages, the schedule has {schedule.stages}")
        if schedule is not None and not self.split_known(weight_fraction):
            self.times(schedule, weight_fraction=weight_fraction)  # a split schedule: the error names the stage
        known = self.split_known(weight_fraction)
        t = self.times(None, weight_fraction=weight_fraction)
        lines = [f"# diffpipe machine file calibrated from {self.source}",
                 "# seconds per microbatch and stage; backward is the input-gradient part I, "
                 "a full B costs full_backward (when given) or I + W"]
        if self.step_time is not None:
            lines.append(f"# measured step time: {self.step_time!r}")
        if self.residual:
            lines.append("# residual: " + ", ".join(f"{k} = {v!r}" for k, v in self.residual.items()))
        if known and self.split_source and not (self.input_grad and self.weight and all(
                v is not None for v in (*self.input_grad, *self.weight))):
            lines.append(f"# I/W split of the full backward from {self.split_source}")
        if not known:
            lines.append("# only full backwards were measured: backward is the full B; schedules with I/W ops "
                         "are refused (split_known = false)")
        lines += ["", "[times]"]
        lines += [f"{key} = {toml_value(_seconds(t[TIMES_KEYS.get(key, key)]))}" for key in TOML_TIMES]
        lines += [f"{key} = {toml_value(_seconds(t[key]))}" for key in TOML_HOST if t[key]]
        if t["full_backward"] is not None:
            lines.append(f"full_backward = {toml_value(_seconds(t['full_backward']))}")
        for kind, seconds in (t["kind_overhead"] or {}).items():
            lines.append(f"{TOML_KIND_OVERHEAD[kind]} = {toml_value(_seconds(seconds))}")
        if not known:
            lines.append("split_known = false")
        lines += ["", "[network]", f"mode = {toml_value(str(mode))}", ""]
        return "\n".join(lines)

    def to_toml(self, path: str | os.PathLike, schedule: Any = None, *,
                weight_fraction: float | None = None, mode: Any = "overlap") -> None:
        """Write ``to_toml_text`` to ``path`` atomically."""
        write_atomic(path, self.to_toml_text(schedule, weight_fraction=weight_fraction, mode=mode), "machine file")


def _explicit(t: dict[str, Any]) -> dict[str, Any]:
    """``Calibration.times`` with every term given explicitly, at the value the cost model would
    default it to (a kind's overhead: ``overhead``; a full B: I + W), so every Hardware (and
    Workload) of a calibration has one array structure and JAX compiles the simulator once per
    graph shape, not once per calibration."""
    kinds = t["kind_overhead"] or {}
    full = t["full_backward"] or [i + w for i, w in zip(t["input_grad"], t["weight"], strict=True)]
    return {**t, "kind_overhead": {kind: kinds.get(kind, t["overhead"]) for kind in TOML_KIND_OVERHEAD},
            "full_backward": full}


def _fenced(values: Sequence[float]) -> list[float]:
    """``values`` inside Tukey's far-out fences (``Q1 - 3 IQR``, ``Q3 + 3 IQR``); all of them when
    there are fewer than 4 (no quartiles to speak of)."""
    if len(values) < 4:
        return list(values)
    q1, _, q3 = statistics.quantiles(values, n=4)
    low, high = q1 - 3 * (q3 - q1), q3 + 3 * (q3 - q1)
    return [v for v in values if low <= v <= high]


def robust_mean(values: Sequence[float]) -> float | None:
    """The mean of ``values`` inside Tukey's far-out fences (``_fenced``).

    A step is a sum of op times, so what predicts it is their mean, not their median: op times
    are skewed to the right (a gloo thread or another process taking the core for a while), and a
    sum of medians under-predicts (``papers/validation/replay.py`` measures by how much). The
    fences drop only gross outliers (a preempted op), not the skew.
    """
    return statistics.fmean(_fenced(values)) if values else None


def robust_spread(values: Sequence[float]) -> float | None:
    """The relative spread of ``values`` as ``robust_mean`` sees them: the standard deviation of
    the values inside its fences over their mean (None for fewer than 2 values or a zero mean)."""
    if len(values) < 2:
        return None
    kept = _fenced(values)
    mean = statistics.fmean(kept)
    return statistics.stdev(kept) / mean if len(kept) >= 2 and mean > 0 else None


def communication_mode(mode: Any) -> Any:
    """``mode`` as ``compile(communication=...)`` takes it: ``"torch-runtime"`` becomes ``TorchRuntime()``
    (a mode of this package, not a built-in name); anything else passes through."""
    return TorchRuntime() if mode == TorchRuntime.name else mode


def _seconds(value: Any) -> Any:
    """Seconds as the machine file writes them (``toml_value``): every number a float, one not
    measured ``"none"``; a list element-wise."""
    if isinstance(value, (list, tuple)):
        return [_seconds(v) for v in value]
    return "none" if value is None else float(value)


#: How ``combine`` joins the runs' op times: ``"pooled"`` (weighted by sample counts) or ``"median"``.
OP_TIMES = ("pooled", "median")


def combine(calibrations: Sequence[Calibration], *, op_times: str = "pooled") -> Calibration:
    """One calibration from several runs of the same stages (other schedules, microbatch counts
    or repetitions), each term with its spread across the runs.

    Per stage and kind, the runs' means weighted by their sample counts (the mean of all the
    samples, each run's gross outliers already dropped), so a full-backward run's ``B`` and a
    zero-bubble run's ``I`` and ``W`` combine into one calibration that measured both; with
    ``op_times="median"``, the median of the runs' means instead (of the runs that measured the
    term): the runs are the independent units, so a run whose ops stalled throughout (a share of
    its samples that its own fences cannot drop) moves no term, as a stalled repetition does not
    move the median of a job's step times (``papers/validation/README.md``, "Stalled rounds"); the
    per-op terms (``overhead`` and by kind, ``p2p`` and ``transfer``, ``setup``, ``wind_down``,
    ``send_cost``, ``recv_cost``) the plain mean over the runs that measured them.
    ``spread[key]`` is, for every term two or more runs measured, the relative standard deviation
    of the runs' values (between runs: what moving from one run to another changes; keys
    ``"F0"``..., ``"overhead"``, ``"p2p"``, ``"setup"``, ``"wind_down"``, ``"send_cost"``,
    ``"recv_cost"``), else the one run's own spread (where it has one). ``samples`` are summed;
    ``stage_ranks`` kept where all runs agree; ``residual["step"]`` is the largest ``|step|``
    residual of the runs (each on its own traced schedule); a ``backward_split`` is the first
    run's that has one. No ``orders`` or ``step_time``: they belong to one run.
    """
    runs = list(calibrations)
    if not runs or not all(isinstance(c, Calibration) for c in runs):
        raise ConfigError("calibration: combine takes a non-empty list of Calibration")
    if op_times not in OP_TIMES:
        raise ConfigError(f"calibration: combine's op_times={op_times!r}: give one of {', '.join(OP_TIMES)}")
    stages = runs[0].stages
    for k, c in enumerate(runs):
        if c.stages != stages:
            raise ConfigError(f"calibration: run {k} has {c.stages} stages, run 0 has {stages}; combine runs of "
                              "the same stages")
    names = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight"}
    per_kind: dict[str, tuple[float | None, ...] | None] = {}
    spread: dict[str, float | None] = {}
    samples: dict[str, int] = {}
    for kind, name in names.items():
        values: list[float | None] = []
        for s in range(stages):
            key = f"{kind}{s}"
            got = [(c._measured(name, s), c.samples.get(key, 1)) for c in runs if c._measured(name, s) is not None]
            if not got:
                values.append(None)
                continue
            weight = sum(n for _, n in got)
            values.append(statistics.median(v for v, _ in got) if op_times == "median" else
                          sum(v * n for v, n in got) / weight)
            samples[key] = sum(c.samples.get(key, 0) for c in runs)
            spread[key] = (_between([v for v, _ in got]) if len(got) > 1 else
                           next(c.spread.get(key) for c in runs if c._measured(name, s) is not None))
        per_kind[name] = None if all(v is None for v in values) else tuple(values)

    def mean(name: str, values: Sequence[float | None]) -> float | None:
        kept = [v for v in values if v is not None]
        if len(kept) > 1:
            spread[name] = _between(kept)
        return statistics.fmean(kept) if kept else None

    host = {}
    for name in TOML_HOST:  # a run that did not time a side (no labels: 0) does not count
        host[name] = mean(name, [getattr(c, name) or None for c in runs]) or 0.0
        own = next((c.spread.get(name) for c in runs if getattr(c, name)), None)
        if name not in spread and own is not None:
            spread[name] = own
        if any(name in c.samples for c in runs):
            samples[name] = sum(c.samples.get(name, 0) for c in runs)
    kinds = sorted({kind for c in runs for kind in c.overhead_by_kind})
    by_kind = {kind: mean(f"overhead_{kind}", [c.overhead_by_kind.get(kind) for c in runs]) for kind in kinds}
    transfer = mean("transfer", [c.transfer for c in runs])
    ranks = {c.stage_ranks for c in runs}
    steps = [abs(c.residual["step"]) for c in runs if c.residual.get("step") is not None]
    durations = [c.residual["durations"] for c in runs if c.residual.get("durations") is not None]
    split = next((c for c in runs if c.backward_split), None)
    return Calibration(
        forward=per_kind["forward"], backward=per_kind["backward"], input_grad=per_kind["input_grad"],
        weight=per_kind["weight"], overhead=mean("overhead", [c.overhead for c in runs]),
        overhead_by_kind=by_kind, p2p=mean("p2p", [c.p2p for c in runs]), transfer=transfer,
        setup=mean("setup", [c.setup for c in runs]), wind_down=mean("wind_down", [c.wind_down for c in runs]),
        send_cost=host["send_cost"], recv_cost=host["recv_cost"],
        stage_ranks=ranks.pop() if len(ranks) == 1 else None, samples=samples, spread=spread,
        residual={"durations": statistics.median(durations) if durations else None,
                  "step": max(steps) if steps else None},
        source=f"{len(runs)} runs: " + "; ".join(c.source for c in runs),
        backward_split=split.backward_split if split else None, split_source=split.split_source if split else None,
    )


def _between(values: Sequence[float]) -> float | None:
    """The relative standard deviation of ``values`` (None for a zero mean)."""
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else None


def from_measurements(forward: Any, backward: Any = None, *, input_grad: Any = None, weight: Any = None,
                      overhead: float = 0.0, p2p: float = 0.0, setup: float = 0.0,
                      wind_down: float = 0.0, send_cost: float = 0.0, recv_cost: float = 0.0) -> Calibration:
    """A ``Calibration`` from times you measured yourself (seconds; per stage, or one number for all).

    ``backward`` is the *full* backward ``B``; ``input_grad`` and ``weight`` the split ``I`` and
    ``W`` (give ``backward``, the split, or both). ``overhead`` is added to every op, ``p2p`` to
    every transfer, ``send_cost`` / ``recv_cost`` to the op that sends / receives each transfer.
    """
    fwd = _stage_values("forward", forward, None)
    if fwd is None or any(v is None for v in fwd):
        raise ConfigError("calibration: forward needs a time for every stage")
    n = len(fwd)
    return Calibration(tuple(float(v) for v in fwd if v is not None), _stage_values("backward", backward, n),
                       _stage_values("input_grad", input_grad, n),
                       _stage_values("weight", weight, n), overhead=overhead, p2p=p2p, setup=setup,
                       wind_down=wind_down, send_cost=send_cost, recv_cost=recv_cost)
