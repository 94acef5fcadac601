"""``TorchRuntime``: the communication mode of ``torch.distributed.pipelining`` over gloo.

Two facts of a torch run on gloo, both visible in its trace (``papers/validation/README.md``):

- gloo's point-to-point is a rendezvous: the payload moves only once the sender has posted its
  ``isend`` and the receiver its ``irecv``. The send is posted right after the producing op
  (torch's ``SEND_F``/``SEND_B`` action follows it) and never blocks the sender.
- torch posts a receive where its lowering pass (``schedules._add_send_recv``) put the ``RECV``
  action: it walks the ranks' compute orders in lock-step and appends the receive to the
  receiver's order when the *sender* schedules the producing op, so a receive is usually posted
  well before the op that needs the data (not just before it, as diffpipe's ``rendezvous``
  assumes).

So a transfer starts when its producer has finished and the receiver has finished the compute op
after which torch posted the receive (at once when it was posted before the rank's first op);
the consumer waits for it to end. ``receive_posts`` runs torch's own lowering (``_add_unshard_reshard``,
``_add_reduce_grad``, ``_add_send_recv``, as ``_PipelineScheduleRuntime`` does) on the
schedule's orders, read as torch reads its CSV (an overlapped ``F;B`` pair, DualPipe-V's, is one
compound action; every other compute op one action); it needs torch.
"""

from __future__ import annotations

from typing import Any

from .._choices import TORCH_RUNTIME
from .._engine._communication import BLOCK, AbstractCommunication, transfers
from .._errors import ConfigError
from ..schedules import Op, Schedule
from ..schedules._torch import torch_cells

_COMPUTE = ("F", "B", "I", "W")


def receive_posts(schedule: Schedule) -> dict[Op, Op | None]:
    """Per consumer of a cross-device transfer, the receiver's compute op after which torch's
    runtime posts its receive (None: before the receiver's first op)."""
    try:
        from torch.distributed.pipelining.schedules import (
            _add_reduce_grad,
            _add_send_recv,
            _add_unshard_reshard,
        )
    except ImportError as error:
        raise ConfigError(f"torch-runtime communication needs torch.distributed.pipelining: {error}") from None
    placement = schedule.placement
    if placement.pipelines != 1:
        raise ConfigError(f"torch-runtime communication: torch runs one pipeline, the schedule has "
                          f"{placement.pipelines}")
    rank_of = {s: placement.device(0, s) for s in range(schedule.stages)}
    computes = _torch_compute_actions(schedule)
    actions = {rank: _add_reduce_grad(_add_unshard_reshard(order), schedule.microbatches)
               for rank, order in enumerate(computes)}
    lowered = _add_send_recv(actions, stage_to_rank=lambda s: rank_of[s], num_stages=schedule.stages)
    posts: dict[Op, Op | None] = {}
    ops = set(schedule.ops)
    for order in lowered.values():
        last = None
        for action in order:
            kind = action.computation_type.value
            if kind in _COMPUTE or action.sub_actions:  # an overlapped pair runs its ops in order
                sub = (action.sub_actions or (action,))[-1]
                last = Op(sub.computation_type.value, sub.stage_index, sub.microbatch_index)
            elif kind in ("RECV_F", "RECV_B"):
                for consumer in ("F",) if kind == "RECV_F" else ("B", "I"):
                    op = Op(consumer, action.stage_index, action.microbatch_index)
                    if op in ops:
                        posts[op] = last
    return posts


def _torch_compute_actions(schedule: Schedule) -> list[list[Any]]:
    """Per rank, the torch ``_Action``s its runtime runs for the schedule's compute ops: its CSV
    cells (``torch_cells``: an overlapped ``F;B`` pair one compound action), so a schedule
    ``from_torch`` built, its CSV and the diffpipe family it came from are lowered alike."""
    from torch.distributed.pipelining.schedules import _Action

    return [[_Action.from_str(cell) for cell in row] for row in torch_cells(schedule)]


class TorchRuntime(AbstractCommunication):
    """``torch-runtime``: a transfer starts when its producer has finished and the receiver has
    finished the op after which torch's runtime posts the receive (``receive_posts``); the
    consumer waits for it to end; the sender does not wait (see the module docstring). Each
    transfer is a node of its own; a device waiting for data is idle."""

    name = TORCH_RUNTIME
    transfer_nodes = True
    wait_edge = BLOCK

    def waits(self, schedule: Schedule, devices_per_node: Any) -> list:
        posts = receive_posts(schedule)
        pairs = []
        for producer, consumer, _ in transfers(schedule):
            after = posts.get(consumer)
            if after is not None:
                pairs.append(((producer, consumer), after))
        return pairs
