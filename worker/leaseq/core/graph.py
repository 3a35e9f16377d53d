"""A graph of jobs to enqueue in one transaction (a pipeline), validated before anything is
written.

Nodes are jobs; an edge says a job waits for a parent: another node of the graph (named by
the :class:`Node` that :meth:`Graph.add` returned, or by its name, so a node may name one added
later), or an existing job (by id: it must exist when the graph is enqueued). Per edge, the
child runs after the parent succeeded (default; the child is cancelled if the parent goes
dead or is cancelled) or after it finished in any state (:attr:`After.FINISHED`).

:meth:`Graph.plan` refuses cycles (naming one), unknown names and duplicate edges with
:class:`InvalidGraph`, and orders the nodes so parents come first.

A node's ``name`` identifies it in the graph; its ``key`` is the flow-control key of the job
(the tenant key of ``Queue.enqueue(key=...)``: the queue's limits for it apply). By default a
node inherits the flow key of the job whose completion writes the graph (``ctx.spawn``,
``ctx.add_graph``); ``key=None`` opts out, and a graph a producer enqueues has no job to
inherit from.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Final

from leaseq.core.errors import InvalidGraph
from leaseq.core.models import After

#: Nodes one graph may hold (a 10,000-page document fans out to 10,000 page jobs).
MAX_NODES = 100_000


class Inherit(Enum):
    """The type of :data:`INHERIT`."""

    PARENT = "inherit"


#: The default flow key of a graph node: the key of the job that spawns it (none when a
#: producer enqueues the graph). Pass ``key=None`` for a job without a key.
INHERIT: Final = Inherit.PARENT

#: A node's flow key as given: a key, None (no key), or INHERIT.
FlowKey = str | None | Inherit


@dataclass(frozen=True)
class Node:
    """A job of a :class:`Graph`, returned by :meth:`Graph.add`; pass it in ``after=``."""

    name: str


@dataclass(frozen=True)
class Dep:
    """One dependency with its own :class:`After`: ``Dep(node_or_id, After.FINISHED)``."""

    parent: Node | str | int
    after: After = After.SUCCEEDED


Parent = Node | str | int | Dep


@dataclass
class NodeSpec:
    """A node's job fields and its parents, as given."""

    name: str
    queue: str
    job_type: str
    payload: Any
    priority: int
    run_at: datetime | None
    delay: float
    max_attempts: int
    timeout: float | None
    idempotency_key: str | None
    key: FlowKey = INHERIT
    after: list[Dep] = field(default_factory=list)


@dataclass(frozen=True)
class PlannedEdge:
    """An edge of a planned graph: ``parent`` is a node index, or ``job_id`` an existing job."""

    child: int
    after: After
    parent: int | None = None
    job_id: int | None = None


@dataclass(frozen=True)
class Plan:
    """A validated graph: nodes parents-first, edges by node index, external parents' ids."""

    name: str
    nodes: list[NodeSpec]
    edges: list[PlannedEdge]
    external: list[int]

    def children_of_nodes(self) -> set[int]:
        """Indexes of the nodes some other node waits for."""
        return {e.parent for e in self.edges if e.parent is not None}


class Graph:
    """Build a pipeline: ``g.add(...)`` each job, then ``queue.enqueue_graph(g)``."""

    def __init__(self, name: str = "pipeline") -> None:
        self.name = name
        self._nodes: dict[str, NodeSpec] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def add(
        self,
        queue: str,
        job_type: str,
        payload: Any = None,
        *,
        name: str | None = None,
        key: FlowKey = INHERIT,
        after: Iterable[Parent] = (),
        when: After = After.SUCCEEDED,
        priority: int = 100,
        run_at: datetime | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> Node:
        """Add a job; it waits for every parent in ``after`` (a :class:`Node`, a node's name,
        an existing job's id, or a :class:`Dep`), each met by ``when`` unless a Dep says
        otherwise. ``name`` names the node in the graph (default: ``n<index>``). ``key`` is
        the job's flow-control key, as on :meth:`leaseq.Queue.enqueue` (its limits apply):
        by default (:data:`INHERIT`) the key of the job that spawns the graph; None for no
        key. Returns the node."""
        name = name if name is not None else f"n{len(self._nodes)}"
        if not isinstance(name, str) or not name:
            raise InvalidGraph(f"node name {name!r} must be a non-empty string")
        if not (key is None or key is INHERIT or isinstance(key, str)):
            raise InvalidGraph(
                f"node {name!r}: key {key!r} is not a flow key (a string, None for no key, "
                "or leaseq.INHERIT)"
            )
        if name in self._nodes:
            raise InvalidGraph(f"two nodes have the name {name!r}")
        if len(self._nodes) >= MAX_NODES:
            raise InvalidGraph(f"a graph holds at most {MAX_NODES} nodes")
        if isinstance(after, str | int | Node | Dep):
            after = [after]
        deps = [p if isinstance(p, Dep) else Dep(p, After(when)) for p in after]
        self._nodes[name] = NodeSpec(
            name,
            queue,
            job_type,
            payload,
            priority,
            run_at,
            delay,
            max_attempts,
            timeout,
            idempotency_key,
            key,
            deps,
        )
        return Node(name)

    def include(self, other: Graph) -> None:
        """Add every node of ``other`` (names must not collide with this graph's)."""
        clash = sorted(self._nodes.keys() & other._nodes.keys())
        if clash:
            raise InvalidGraph(f"both graphs have nodes named {clash}")
        if len(self._nodes) + len(other._nodes) > MAX_NODES:
            raise InvalidGraph(f"a graph holds at most {MAX_NODES} nodes")
        self._nodes.update(other._nodes)

    def plan(self) -> Plan:
        """The graph validated and ordered parents-first; InvalidGraph naming the problem."""
        if not self._nodes:
            raise InvalidGraph("the graph has no jobs")
        keys = list(self._nodes)
        flow_keys = {s.key for s in self._nodes.values() if isinstance(s.key, str)}
        parents: dict[str, list[tuple[str | int, After]]] = {}
        for key, spec in self._nodes.items():
            seen: set[str | int] = set()
            found: list[tuple[str | int, After]] = []
            for dep in spec.after:
                target = dep.parent.name if isinstance(dep.parent, Node) else dep.parent
                if isinstance(target, bool) or not isinstance(target, str | int):
                    raise InvalidGraph(
                        f"node {key!r} waits for {target!r}: pass a node, its name, or a job id"
                    )
                if isinstance(target, str) and target not in self._nodes:
                    hint = (
                        f" ({target!r} is a flow key, key=; a node is named with name=)"
                        if target in flow_keys
                        else ""
                    )
                    raise InvalidGraph(f"node {key!r} waits for unknown node {target!r}{hint}")
                if isinstance(target, int) and target < 1:
                    raise InvalidGraph(f"node {key!r} waits for job {target}, not a job id")
                if target == key:
                    raise InvalidGraph(f"node {key!r} waits for itself")
                if target in seen:
                    raise InvalidGraph(f"node {key!r} waits for {target!r} twice")
                seen.add(target)
                found.append((target, After(dep.after)))
            parents[key] = found
        order = _topological(keys, parents)
        index = {key: i for i, key in enumerate(order)}
        edges: list[PlannedEdge] = []
        external: list[int] = []
        for key in order:
            for target, after in parents[key]:
                if isinstance(target, str):
                    edges.append(PlannedEdge(index[key], after, parent=index[target]))
                else:
                    edges.append(PlannedEdge(index[key], after, job_id=target))
                    if target not in external:
                        external.append(target)
        return Plan(self.name, [self._nodes[k] for k in order], edges, external)


def _topological(
    keys: Sequence[str], parents: dict[str, list[tuple[str | int, After]]]
) -> list[str]:
    """Kahn's order (parents first, otherwise as added); InvalidGraph naming a cycle."""
    waiting = {k: sum(1 for p, _ in parents[k] if isinstance(p, str)) for k in keys}
    children: dict[str, list[str]] = {k: [] for k in keys}
    for k in keys:
        for p, _ in parents[k]:
            if isinstance(p, str):
                children[p].append(k)
    ready = deque(k for k in keys if waiting[k] == 0)
    order: list[str] = []
    while ready:
        k = ready.popleft()
        order.append(k)
        for c in children[k]:
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    if len(order) == len(keys):
        return order
    raise InvalidGraph("cycle: " + " -> ".join(_a_cycle(keys, parents, set(order))))


def _a_cycle(
    keys: Sequence[str], parents: dict[str, list[tuple[str | int, After]]], done: set[str]
) -> list[str]:
    """One cycle among the nodes not in ``done``, as parent -> ... -> the same parent."""
    start = next(k for k in keys if k not in done)
    path: list[str] = []
    at: str = start
    while at not in path:
        path.append(at)
        at = next(p for p, _ in parents[at] if isinstance(p, str) and p not in done)
    loop = [*path[path.index(at) :], at]
    return list(reversed(loop))
