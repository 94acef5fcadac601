"""Interchange with ``torch.distributed.pipelining``: its compute-only CSV, and its built-in schedules.

The CSV is what ``PipelineScheduleMulti._dump_csv`` writes and ``_load_csv`` reads (torch 2.13):
one row per rank, one action per cell, each cell ``str(_Action)``: ``[stage][type][microbatch]``,
e.g. ``2F0``, ``1I3``, ``0W1``, ``0B2``; an empty cell is an idle step (torch writes its ``None``
bubbles as empty strings). A compound cell ``(0F7;7B3)OVERLAP_F_B`` (DualPipe-V's overlapped pair)
becomes its sub-actions, in order, marked as an overlapped pair (``Schedule.overlapped``) when they
are a forward then a backward; the writer writes marked pairs back as compounds. Communication and
bookkeeping actions (``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``, ``UNSHARD``, ``RESHARD``,
``REDUCE_GRAD``) are skipped: diffpipe derives transfers from the placement and the data
dependencies, and models collectives as ``R`` ops.

torch has no notion of concurrent pipelines (model replicas) and maps stages to ranks either
loop-wise (``s mod D``) or V-wise (``s`` if ``s < D`` else ``2D-1-s``); the writer refuses other
schedules, and ``U``/``R`` ops, with one line saying why. torch is imported only inside
``from_torch``.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Sequence

from .._errors import ConfigError, ScheduleError
from .._io import read_text, write_atomic
from ._schedule import Op, Placement, Schedule

#: Compute action types of torch and the diffpipe op kinds they become.
_COMPUTE = {"F": "F", "I": "I", "W": "W", "B": "B"}
#: Communication / bookkeeping action types: not compute, skipped on reading.
SKIPPED_ACTIONS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")
_ACTION = re.compile(r"(\d+)(F|I|W|B|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)")
_COMPOUND = re.compile(r"\((.*)\)([A-Za-z_]+)")

#: diffpipe family names -> torch schedule names (as ``schedules.get_schedule_class`` spells them).
TORCH_NAMES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "looped-bfs": "LoopedBFS",
    "zb": "InterleavedZeroBubble",
    "zb-h1": "InterleavedZeroBubble",
    "zb-v": "ZBVZeroBubble",
    "dualpipe-v": "DualPipeV",
}
#: torch schedules whose stages sit on a V (``generate_stage_to_rank_mapping(style="v")``).
_V_STYLE = ("ZBVZeroBubble", "DualPipeV")


# -- reading ----------------------------------------------------------------------------------------


def _parse_cell(cell: str) -> list[tuple[str, int, int]] | None:
    """``(kind, stage, microbatch)`` of the compute ops in a cell, or None if malformed."""
    compound = _COMPOUND.fullmatch(cell)
    if compound:
        inner, kind = compound.groups()
        if kind != "OVERLAP_F_B":
            return None
        parts = [_parse_cell(part.strip()) for part in inner.split(";")]
        if not parts or any(p is None or len(p) != 1 for p in parts):
            return None
        return [p[0] for p in parts if p]
    match = _ACTION.fullmatch(cell)
    if not match:
        return None
    stage, kind, microbatch = match.groups()
    if kind not in _COMPUTE:
        return []
    if not microbatch:
        return None
    return [(_COMPUTE[kind], int(stage), int(microbatch))]


def _where(path: str, row: int, column: int, cell: str) -> str:
    return f"{path}: row {row + 1} (rank {row}), column {column + 1}: cell {cell!r}"


def _resolve_placement(
    path: str,
    cells: Sequence[tuple[int, int, str, Op]],
    devices: int,
    stages: int,
    placement: None | str | Placement,
) -> Placement:
    """The placement to use: given, named (``"loop"``/``"v"``), or inferred from where stages appear."""
    if isinstance(placement, Placement):
        if placement.devices != devices or placement.pipelines != 1:
            raise ScheduleError(
                f"{path}: the CSV has {devices} ranks and one pipeline, but the placement has "
                f"{placement.devices} devices and {placement.pipelines} pipelines"
            )
        candidates = [placement]
    elif placement in (None, "loop", "v"):
        candidates = []
        if placement in (None, "loop"):
            if stages % devices == 0:
                chunks = stages // devices
                candidates.append(
                    Placement.linear(devices) if chunks == 1 else Placement.loop(devices, chunks)
                )
            elif placement == "loop":
                raise ScheduleError(
                    f"{path}: a loop placement needs a multiple of {devices} stages (one per rank per "
                    f"chunk), but the CSV names stages 0..{stages - 1}"
                )
        if placement in (None, "v"):
            if stages == 2 * devices:
                candidates.append(Placement.v(devices))
            elif placement == "v":
                raise ScheduleError(
                    f"{path}: a V placement needs 2 x {devices} = {2 * devices} stages, "
                    f"but the CSV names stages 0..{stages - 1}"
                )
        if not candidates:
            raise ScheduleError(
                f"{path}: {stages} stages on {devices} ranks fit neither a loop placement (a multiple "
                f"of {devices}) nor a V placement ({2 * devices}); pass placement="
            )
    else:
        raise ScheduleError(f"placement must be None, 'loop', 'v' or a Placement, got {placement!r}")

    for candidate in candidates:
        if all(op.stage < candidate.stages and candidate.device(0, op.stage) == r for r, _, _, op in cells):
            return candidate
    # Name the first cell that the (last) candidate puts elsewhere.
    last = candidates[-1]
    for r, c, cell, op in cells:
        if op.stage >= last.stages:
            raise ScheduleError(
                f"{_where(path, r, c, cell)}: stage {op.stage} is outside the placement's "
                f"0..{last.stages - 1}"
            )
        home = last.device(0, op.stage)
        if home != r:
            names = " or ".join(f"{p.name} placement (rank {p.device(0, op.stage)})" for p in candidates)
            raise ScheduleError(
                f"{_where(path, r, c, cell)}: stage {op.stage} is on rank {r}, but a {names} puts it "
                "elsewhere; pass placement="
            )
    raise AssertionError("unreachable")  # pragma: no cover


def from_torch_csv(path: str | os.PathLike[str], *, placement: None | str | Placement = None) -> Schedule:
    """Read torch's compute-only pipeline CSV into a validated ``Schedule``.

    Args:
        path: the CSV (one row per rank, one action per cell; empty cells are idle steps).
        placement: the stage-to-rank map: ``None`` to infer it (linear or loop ``s mod D`` if every
            stage appears on that rank, else V), ``"loop"``, ``"v"``, or a ``Placement``.

    Communication/bookkeeping actions (``SEND_*``, ``RECV_*``, ``UNSHARD``, ``RESHARD``,
    ``REDUCE_GRAD``) are skipped; ``OVERLAP_F_B`` compounds become their sub-actions in order.
    Trailing empty rows are ignored. The number of microbatches is one more than the largest
    microbatch named.

    Raises:
        ScheduleError: one line naming the file, and for a malformed or misplaced cell its row
            (rank), column and text; schedules that fail validation (a missing op, a deadlock)
            are rejected with the validation message.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ScheduleError(f"from_torch_csv: path must be a string or a Path, got {path!r}")
    name = os.fspath(path)
    try:
        text = read_text(name, "from_torch_csv")
    except ConfigError as error:
        raise ScheduleError(str(error)) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        rows = [list(row) for row in reader]
    except csv.Error as error:
        raise ScheduleError(f"{name}:{reader.line_num}: not a CSV file: {error}") from None
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()
    if not rows:
        raise ScheduleError(f"{name}: no actions (expected one row per rank)")

    cells: list[tuple[int, int, str, Op]] = []
    compounds: list[tuple[Op, Op]] = []  # (forward, backward) of each OVERLAP_F_B pair
    seen: dict[Op, tuple[int, int]] = {}
    for r, row in enumerate(rows):
        for c, raw in enumerate(row):
            cell = raw.strip()
            if not cell:
                continue
            parsed = _parse_cell(cell)
            if parsed is None:
                raise ScheduleError(
                    f"{_where(name, r, c, raw)} is not a torch action: expected [stage][F|I|W|B][microbatch] "
                    "such as '2F0', a compound '(0F7;7B3)OVERLAP_F_B', or a skipped communication action"
                )
            for kind, stage, microbatch in parsed:
                op = Op(kind, stage, microbatch)
                if op in seen:
                    r0, c0 = seen[op]
                    raise ScheduleError(
                        f"{_where(name, r, c, raw)}: op {op} is duplicated "
                        f"(first at row {r0 + 1}, column {c0 + 1})"
                    )
                seen[op] = (r, c)
                cells.append((r, c, raw, op))
            if len(parsed) == 2 and parsed[0][0] == "F" and parsed[1][0] in ("B", "I"):
                compounds.append((Op(*parsed[0]), Op(*parsed[1])))
    if not cells:
        raise ScheduleError(f"{name}: no compute actions (F, I, W, B)")

    devices = len(rows)
    stages = 1 + max(op.stage for *_, op in cells)
    microbatches = 1 + max(op.microbatch for *_, op in cells)
    # every stage runs every microbatch: numbers past the cells' count are wrong (checked before
    # the placement or the schedule is built from them)
    for number, what in ((stages, "stage"), (microbatches, "microbatch")):
        if number > len(cells):
            r, c, raw, op = max(cells, key=lambda x: x[3].stage if what == "stage" else x[3].microbatch)
            raise ScheduleError(f"{_where(name, r, c, raw[:40])}: {what} {number - 1} is past the {len(cells)} "
                                f"compute actions of the file (every {what} runs every "
                                f"{'microbatch' if what == 'stage' else 'stage'})")
    chosen = _resolve_placement(name, cells, devices, stages, placement)
    orders: list[list[Op]] = [[] for _ in range(devices)]
    for r, _, _, op in cells:
        orders[r].append(op)
    try:
        return Schedule(chosen, orders, microbatches, overlapped=_marks(orders, compounds))
    except ScheduleError as error:
        raise ScheduleError(f"{name}: {error}") from None


def _marks(orders: Sequence[Sequence[Op]], pairs: Sequence[tuple[Op, Op]]) -> frozenset[tuple[int, int]]:
    """``Schedule.overlapped`` of compound pairs: the (device, index) of each pair's forward."""
    where = {op: (d, i) for d, order in enumerate(orders) for i, op in enumerate(order)}
    return frozenset(where[f] for f, _ in pairs)


# -- writing ----------------------------------------------------------------------------------------


def _torch_style(placement: Placement) -> str | None:
    """``"loop"`` or ``"v"`` if torch can express the placement, else None."""
    if placement.pipelines != 1 or placement.stages % placement.devices:
        return None
    row = placement.table[0]
    if row == Placement.loop(placement.devices, placement.stages // placement.devices).table[0]:
        return "loop"
    if placement.stages == 2 * placement.devices and row == Placement.v(placement.devices).table[0]:
        return "v"
    return None


def torch_cells(schedule: Schedule) -> list[list[str]]:
    """Per device, the cells torch's runtime reads for ``schedule``'s compute ops: one op per cell,
    an overlapped pair (``Schedule.overlapped``) one compound cell ``(aFb;cBd)OVERLAP_F_B``; ``U`` and
    ``R`` ops, which torch's compute-only form lacks, left out."""
    rows = []
    for d, order in enumerate(schedule.orders):
        row, i = [], 0
        while i < len(order):
            if (d, i) in schedule.overlapped:
                row.append(f"({order[i]};{order[i + 1]})OVERLAP_F_B")
                i += 2
                continue
            if order[i].kind not in ("U", "R"):
                row.append(str(order[i]))
            i += 1
        rows.append(row)
    return rows


def to_torch_csv(schedule: Schedule, path: str | os.PathLike[str] | None = None) -> str:
    """``schedule`` as torch's compute-only CSV: one row per device, one op per cell (no idle cells);
    an overlapped pair (``Schedule.overlapped``) is one compound cell ``(aFb;cBd)OVERLAP_F_B``.

    Returns the text; with ``path`` also writes it there atomically (``diffpipe._io.write_atomic``:
    a failure leaves any existing file unchanged and no temporary file behind).

    Raises:
        ScheduleError: the schedule has several pipelines (model replicas), a placement other
            than linear, loop or V, or ``U``/``R`` ops; torch's CSV cannot express those.
    """
    if not isinstance(schedule, Schedule):
        raise ScheduleError(f"to_torch_csv: expected a Schedule, got {schedule!r}")
    if schedule.pipelines != 1:
        raise ScheduleError(
            f"to_torch_csv: {schedule.family} runs {schedule.pipelines} pipelines (model replicas); "
            "torch's pipeline CSV has one"
        )
    if _torch_style(schedule.placement) is None:
        raise ScheduleError(
            f"to_torch_csv: {schedule.family}'s {schedule.placement.name} placement is neither a loop "
            "(stage s on rank s mod D) nor a V, the two stage-to-rank maps torch uses"
        )
    for device, order in enumerate(schedule.orders):
        for op in order:
            if op.kind in ("U", "R"):
                what = "an optimizer step" if op.kind == "U" else "a collective"
                raise ScheduleError(
                    f"to_torch_csv: op {op} on device {device} is {what} ({op.kind}); torch's "
                    "compute-only CSV has only F, I, W and B"
                )
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerows(torch_cells(schedule))
    text = buffer.getvalue()
    if path is not None:
        write_atomic(path, text, "to_torch_csv")
    return text


# -- torch's built-in schedules ---------------------------------------------------------------------


def torch_name(name: str) -> str:
    """torch's name of a schedule, from a diffpipe family name or a torch name (any case)."""
    if name in TORCH_NAMES:
        return TORCH_NAMES[name]
    for known in dict.fromkeys(TORCH_NAMES.values()):
        if name.lower() == known.lower():
            return known
    choices = ", ".join(list(TORCH_NAMES) + list(dict.fromkeys(TORCH_NAMES.values())))
    raise ScheduleError(f"from_torch: unknown schedule {name!r}; known: {choices}")


def _torch_actions(name: str, devices: int, microbatches: int, stages_per_rank: int) -> list[list[object]]:
    """torch's per-rank compute actions, via ``_schedule_visualizer.get_schedule_ops``.

    ``get_schedule_ops`` refuses ``stages_per_rank=1`` for torch's multi-stage classes, whose
    generators handle it (InterleavedZeroBubble with one stage is ZB-H1); that case builds the
    class against the same mocked stage.
    """
    from torch.distributed.pipelining import _schedule_visualizer as visualizer
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class

    cls = get_schedule_class(name)
    if stages_per_rank != 1 or not issubclass(cls, PipelineScheduleMulti):
        return visualizer.get_schedule_ops(name, devices, microbatches, stages_per_rank)
    from unittest import mock

    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, devices, None, devices
    schedule = cls([stage], microbatches)
    return [list(schedule.pipeline_order[rank]) for rank in range(devices)]


def from_torch(name: str, devices: int, microbatches: int, stages_per_rank: int = 1) -> Schedule:
    """torch's built-in schedule ``name`` for ``devices`` ranks and ``microbatches``, as a ``Schedule``.

    ``name`` is a diffpipe family (gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb or zb-h1, zb-v,
    dualpipe-v) or torch's own name (GPipe, 1F1B, Interleaved1F1B, LoopedBFS,
    InterleavedZeroBubble, ZBVZeroBubble, DualPipeV). Built through
    ``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops`` against mocked stages;
    the order is validated like any other, so an invalid torch order raises ``ScheduleError``
    naming the op (torch 2.13's 1F1B order, for one, is wrong on the last rank).
    ZBVZeroBubble and DualPipeV use a V placement (2 stages per rank; ``stages_per_rank=1`` is
    read as 2 for them), the others a loop of ``stages_per_rank`` chunks (linear for 1).
    DualPipeV's ``OVERLAP_F_B`` actions become marked overlapped pairs (``Schedule.overlapped``).
    """
    for label, value in (
        ("devices", devices),
        ("microbatches", microbatches),
        ("stages_per_rank", stages_per_rank),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"from_torch: {label} must be an int >= 1, got {value!r}")
    torch_schedule = torch_name(name)
    v_style = torch_schedule in _V_STYLE
    if v_style and stages_per_rank == 1:
        stages_per_rank = 2
    where = (
        f"torch {torch_schedule} (devices={devices}, microbatches={microbatches}, "
        f"stages_per_rank={stages_per_rank})"
    )
    try:
        actions = _torch_actions(torch_schedule, devices, microbatches, stages_per_rank)
    except ImportError as error:
        raise ScheduleError(f"from_torch needs torch.distributed.pipelining: {error}") from None
    except (ValueError, AssertionError, RuntimeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ScheduleError(f"{where}: torch refuses: {first}") from None

    orders: list[list[Op]] = []
    compounds: list[tuple[Op, Op]] = []
    for rank_actions in actions:
        order = []
        for action in rank_actions:
            if action is None:
                continue
            ops = [Op(_COMPUTE[sub.computation_type.value], sub.stage_index, sub.microbatch_index)
                   for sub in action.sub_actions or (action,) if sub.computation_type.value in _COMPUTE]
            if action.sub_actions and len(ops) == 2 and ops[0].kind == "F" and ops[1].kind in ("B", "I"):
                compounds.append((ops[0], ops[1]))
            order.extend(ops)
        orders.append(order)
    if v_style:
        placement = Placement.v(devices)
    else:
        placement = (
            Placement.linear(devices) if stages_per_rank == 1 else Placement.loop(devices, stages_per_rank)
        )
    try:
        return Schedule(placement, orders, microbatches, options={"torch": torch_schedule},
                        overlapped=_marks(orders, compounds))
    except ScheduleError as error:
        raise ScheduleError(f"{where}: {error}") from None
