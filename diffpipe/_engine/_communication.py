"""Communication modes: how a transfer between devices is modelled, as small strategy objects.

A mode is an ``AbstractCommunication``. It declares, once, everything the rest of diffpipe needs:

- ``transfer_nodes``: whether a cross-device transfer is a node of its own (a lane op with a
  duration) or a delay on its data edge;
- ``waits(schedule, devices_per_node)``: the extra ``(waiter, waited)`` constraints among ops and
  transfers (a transfer is its ``(producer, consumer)`` pair): the issue order on a link, the
  devices a blocking transfer holds. ``compile`` turns them into edges; the reference evaluator
  (``schedules._reference.evaluate_network``) solves them;
- ``links(latency, bandwidth)`` (JAX arrays) and ``cost(seconds)`` (the reference): each
  transfer's cost as this mode sees the physical links;
- ``busy_weight``: how many device lanes one transfer node keeps busy (0, or 2: sender and
  receiver), for bubble ratios;
- ``tail_waits(schedule, device)``: what an op appended after the device's last op waits for
  besides that op (``compile(gradient_sync=True)``'s optimizer steps): a blocking transfer the
  last op sends holds the device until it ends.

A mode is an equinox abstract module (as diffrax's solvers): ``name`` is an abstract class
variable, ``AbstractLaneCommunication.lane`` an abstract method, and a parametrised mode declares
its parameters as fields (hashable values: a mode is a static field of ``Graph``, the one holder
of a mode: a cost model reads it from the graph it prices). Strings stay accepted where users type
them (``compile(communication="contention")``, ``simulate(..., communication=...)``, the CLI);
``communication(x)`` is the one place they become objects. A mode compares equal to its name
(and hashes as it) and prints as it: results carry the mode object where users select by name
(``SweepResult``'s ``communication`` column, ``Comparison.communication``, ``Graph.communication``).
A new mode is one subclass (see ``tests/test_communication.py`` for one defined outside the
package).

No ``from __future__ import annotations`` here: equinox reads the ``AbstractClassVar`` annotation
of ``name`` when the class is created (stringified, ``eqx.AbstractClassVar[str]`` became a field).
"""

import abc
import dataclasses
from collections.abc import Callable, Hashable
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._choices import COMMUNICATION_MODES
from .._errors import ConfigError
from ..schedules import Op, Schedule
from ..schedules._reference import as_duration_fn, evaluate

Transfer = tuple[Op, Op]  #: the transfer on the data edge producer -> consumer
Node = Op | Transfer  #: what a wait names: an op or a transfer
LINK, BLOCK = "link", "block"  #: kinds of wait edges (``Graph.edge``: a link's order, a held device)


def node_size(devices_per_node: int | None, devices: int) -> int:
    """The topology rule: ``devices_per_node=None`` means one node holding all ``devices``."""
    return devices if devices_per_node is None else devices_per_node


def topology(devices_per_node: int | None, devices: int) -> int | None:
    """The canonical form of ``devices_per_node`` for ``devices``: None when they all share one
    node (``node_size``), else the devices per node. Equal forms give equal lanes."""
    per_node = node_size(devices_per_node, devices)
    return None if per_node >= devices else per_node


def transfers(schedule: Schedule) -> list[tuple[Op, Op, Any]]:
    """Every cross-device transfer ``(producer, consumer, dep)``, in ``compile``'s node order."""
    return [(dep.op, op, dep) for op in schedule.ops for dep in schedule.dependencies[op] if dep.is_transfer]


def transfer_order(schedule: Schedule, lane_of: Callable[[int, int], Hashable]) -> dict[Hashable, list[Transfer]]:
    """The issue order of transfers on each lane (``lane_of(src, dst)`` names it).

    ``(producer, consumer)`` pairs sorted by the producer's finish at the default unit durations
    (F=1, B=2, I=W=1: ``_reference.DEFAULT_DURATIONS``), ties by topological position. Every
    dependency then increases that key, so chaining a lane's transfers in this order never
    creates a cycle.
    """
    _, finish = evaluate(schedule, as_duration_fn(None))
    position = {op: i for i, op in enumerate(schedule.ops)}
    lanes: dict[Hashable, list[Transfer]] = {}
    for producer, consumer, dep in transfers(schedule):
        lanes.setdefault(lane_of(dep.src, dep.dst), []).append((producer, consumer))
    for queue in lanes.values():
        queue.sort(key=lambda pair: (finish[pair[0]], position[pair[0]]))
    return lanes


class AbstractCommunication(eqx.Module):
    """How transfers are modelled (see the module docstring).

    Subclasses set ``name`` and the class variables that differ from these defaults, and override
    what differs from the default methods (a delay on each data edge at the link's cost, no
    waits). Parameters are fields, of hashable values: a mode is a static field of ``Graph``;
    modes that compile to the same graph share a ``graph_key``.
    """

    name: eqx.AbstractClassVar[str]
    #: a transfer is a node (with a duration and a lane) rather than a delay on its data edge
    transfer_nodes: ClassVar[bool] = False
    #: ``LINK`` or ``BLOCK``: the ``Graph.edge`` type of the waits ``compile`` adds
    wait_edge: ClassVar[str] = LINK
    #: device lanes one transfer node keeps busy: 0 (only its link), 2 (sender and receiver)
    busy_weight: ClassVar[int] = 0
    #: why a schedule deadlocks under this mode (``compile``'s error when the waits form a cycle)
    deadlock: ClassVar[str] = "its waits form a cycle"

    def waits(self, schedule: Schedule, devices_per_node: int | None) -> list[tuple[Node, Node]]:
        """``(waiter, waited)`` pairs beyond the dependencies: the waiter starts after the waited ends."""
        return []

    def tail_waits(self, schedule: Schedule, device: int) -> list[Node]:
        """What an op appended after ``device``'s last op waits for besides that op (default: nothing)."""
        return []

    def links(self, latency: Float[Array, "d d"], bandwidth: Float[Array, "d d"]) -> tuple[Array, Array]:
        """Per-pair latency and bandwidth as this mode charges them (transfers and collectives)."""
        return latency, bandwidth

    def cost(self, seconds: float) -> float:
        """The reference's transfer time, given its time on the physical link (mirrors ``links``)."""
        return seconds

    @property
    def graph_key(self) -> Hashable:
        """Modes with equal keys compile to identical graphs (edge modes without waits share one)."""
        return self if self.transfer_nodes else "edges"

    # -- identity: equal to its name, hashed as it, printed as it (the module docstring) ------------
    # Every jitted call hashes and compares the modes in its arguments' static fields: these read
    # class and instance attributes with ``object.__getattribute__``, not equinox's (a Python hook).
    def _fields(self) -> tuple:
        get = object.__getattribute__
        return tuple((f.name, get(self, f.name)) for f in dataclasses.fields(type(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return other == type(self).name
        if type(other) is not type(self):
            return False
        return other is self or other._fields() == self._fields()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(type(self).name)

    def __str__(self) -> str:
        return type(self).name


class NoCommunication(AbstractCommunication):
    """``none``: transfers are free (idealised); collectives too."""

    name = "none"

    def links(self, latency, bandwidth):
        return jnp.zeros_like(latency), jnp.full_like(bandwidth, jnp.inf)

    def cost(self, seconds: float) -> float:
        return 0.0


class Overlap(AbstractCommunication):
    """``overlap``: a consumer starts a transfer's time after its producer; no contention, and
    transfers overlap compute."""

    name = "overlap"


class AbstractLaneCommunication(AbstractCommunication):
    """Transfers are nodes on lanes: each lane carries one transfer at a time, in issue order
    (``transfer_order``). Subclasses name the lane of each transfer with ``lane``."""

    transfer_nodes = True

    @abc.abstractmethod
    def lane(self, src: int, dst: int, devices_per_node: int) -> Hashable:
        """The lane a transfer from device ``src`` to ``dst`` occupies."""

    def waits(self, schedule, devices_per_node):
        per_node = node_size(devices_per_node, schedule.devices)
        return self.lane_waits(schedule, lambda s, d: self.lane(s, d, per_node))

    @staticmethod
    def lane_waits(schedule: Schedule, lane_of: Callable[[int, int], Hashable]) -> list[tuple[Node, Node]]:
        """``(waiter, waited)`` pairs chaining each lane's transfers in issue order
        (``transfer_order``): each transfer waits for the one issued before it on its lane
        (``lane_of(src, dst)`` names the lane). For a mode whose lanes are not per link, e.g. a
        ``waits`` that adds a shared lane per device pair to another mode's waits."""
        pairs: list[tuple[Node, Node]] = []
        for queue in transfer_order(schedule, lane_of).values():
            pairs.extend(zip(queue[1:], queue[:-1]))
        return pairs


class Contention(AbstractLaneCommunication):
    """``contention``: each directed link inside a node, and each node's NIC for inter-node
    traffic, carries one transfer at a time, in issue order (``transfer_order``)."""

    name = "contention"

    def lane(self, src, dst, devices_per_node):
        if src // devices_per_node == dst // devices_per_node:
            return ("link", src, dst)
        return ("nic", src // devices_per_node)  # shared by all inter-node traffic leaving the node


def _meeting_waits(schedule: Schedule, *, sender_waits: bool) -> list[tuple[Node, Node]]:
    """Each transfer waits for the receiver's op before its consumer (the receive is posted then);
    with ``sender_waits``, the sender's op after the producer also waits for the transfer. An
    overlapped pair (``Schedule.overlapped``) is one op here: its receives are posted before it,
    and the op after it is the one after its backward."""
    orders = schedule.orders
    position = {(d, op): i for d, order in enumerate(orders) for i, op in enumerate(order)}
    opens = schedule.pairs
    closes = set(opens.values())
    pairs: list[tuple[Node, Node]] = []
    for producer, consumer, dep in transfers(schedule):
        i = position[(dep.dst, consumer)] - (consumer in closes)
        if i > 0:
            pairs.append(((producer, consumer), orders[dep.dst][i - 1]))
        i = position[(dep.src, producer)] + (producer in opens)
        if sender_waits and i + 1 < len(orders[dep.src]):
            pairs.append((orders[dep.src][i + 1], (producer, consumer)))
    return pairs


class Blocking(AbstractCommunication):
    """``blocking``: a transfer starts when its producer has finished and the receiver has
    finished the op before the consumer; the sender's next op waits for it to end. Both devices
    are busy for its duration; send and receive orders that disagree deadlock."""

    name = "blocking"
    transfer_nodes = True
    wait_edge = BLOCK
    busy_weight = 2
    deadlock = "send and receive orders disagree"

    def waits(self, schedule, devices_per_node):
        return _meeting_waits(schedule, sender_waits=True)

    def tail_waits(self, schedule, device):
        last = schedule.orders[device][-1]
        ends = {last, *(f for f, b in schedule.pairs.items() if b == last)}  # a pair sends at its end
        return [(producer, consumer) for producer, consumer, _ in transfers(schedule) if producer in ends]


class Rendezvous(AbstractCommunication):
    """``rendezvous``: sender and receiver meet. A transfer starts when the sender has reached its
    send (its producer has finished) and the receiver has reached its receive (it has finished the
    op before the consumer: the receive is posted just before the op that needs the data); the
    consumer waits for it to end. The send is asynchronous (torch's ``isend``): the sender's next
    op does not wait, so, unlike ``blocking``, no order of sends and receives deadlocks. Each
    transfer is a node of its own (no link contention); a device waiting for data is idle."""

    name = "rendezvous"
    transfer_nodes = True
    wait_edge = BLOCK

    def waits(self, schedule, devices_per_node):
        return _meeting_waits(schedule, sender_waits=False)


#: The built-in modes by name (``_choices.COMMUNICATION_MODES``, each its class's ``name``): the
#: strings accepted at the API's edge.
MODES: dict[str, type[AbstractCommunication]] = dict(
    zip(COMMUNICATION_MODES, (NoCommunication, Overlap, Contention, Blocking, Rendezvous), strict=True)
)


def communication(mode: str | AbstractCommunication, *, what: str = "communication") -> AbstractCommunication:
    """The mode object for ``mode``: a name (``none``, ``overlap``, ``contention``, ``blocking``,
    ``rendezvous``) or an ``AbstractCommunication``, returned as is. Raises ``ConfigError`` (naming ``what``)
    otherwise."""
    if isinstance(mode, AbstractCommunication):
        return mode
    if isinstance(mode, str) and mode in MODES:
        return MODES[mode]()
    raise ConfigError(f"{what} {mode!r} is not one of {', '.join(MODES)} (or an AbstractCommunication)")

