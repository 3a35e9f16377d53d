"""The graph builder's validation, without a database: what is refused, and the order."""

from __future__ import annotations

import pytest

import leaseq
from leaseq import After, Dep, Graph


def test_nodes_come_parents_first_and_keep_their_order_otherwise() -> None:
    g = Graph("doc")
    g.add("q", "merge", key="merge", after=["p0", "p1"])
    g.add("q", "page", key="p0")
    g.add("q", "page", key="p1", after=[Dep(7, After.FINISHED)])
    plan = g.plan()
    assert [n.key for n in plan.nodes] == ["p0", "p1", "merge"]
    assert plan.external == [7]
    assert {(e.child, e.parent, e.job_id, e.after) for e in plan.edges} == {
        (1, None, 7, After.FINISHED),
        (2, 0, None, After.SUCCEEDED),
        (2, 1, None, After.SUCCEEDED),
    }


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda g: g.add("q", "a", key="a", after=["a"]), "node 'a' waits for itself"),
        (lambda g: g.add("q", "a", key="a", after=["b"]), "node 'a' waits for unknown node 'b'"),
        (lambda g: g.add("q", "a", key="a", after=[3, 3]), "node 'a' waits for 3 twice"),
        (lambda g: g.add("q", "a", key="a", after=[0]), "waits for job 0, not a job id"),
        (lambda g: g.add("q", "a", key="a", after=[True]), "name a node, its key, or a job id"),
    ],
)
def test_bad_edges_are_refused_naming_the_node(build: object, problem: str) -> None:
    g = Graph()
    build(g)  # type: ignore[operator]
    with pytest.raises(leaseq.InvalidGraph, match=problem):
        g.plan()


def test_a_cycle_is_named_and_nodes_outside_it_do_not_matter() -> None:
    g = Graph()
    g.add("q", "x", key="x")
    g.add("q", "a", key="a", after=["x", "b"])
    g.add("q", "b", key="b", after=["a"])
    g.add("q", "after-the-cycle", key="c", after=["b"])
    with pytest.raises(leaseq.InvalidGraph, match=r"cycle: (a -> b -> a|b -> a -> b)"):
        g.plan()


def test_keys_are_unique_within_a_graph_and_across_included_graphs() -> None:
    g = Graph()
    g.add("q", "a", key="a")
    with pytest.raises(leaseq.InvalidGraph, match="two nodes have the key 'a'"):
        g.add("q", "a", key="a")
    other = Graph()
    other.add("q", "a", key="a")
    with pytest.raises(leaseq.InvalidGraph, match=r"keys \['a'\]"):
        g.include(other)
    with pytest.raises(leaseq.InvalidGraph, match="no jobs"):
        Graph().plan()
