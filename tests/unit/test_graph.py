"""The graph builder's validation, without a database: what is refused, and the order."""

from __future__ import annotations

import pytest

import leaseq
from leaseq import After, Dep, Graph


def test_nodes_come_parents_first_and_keep_their_order_otherwise() -> None:
    g = Graph("doc")
    g.add("q", "merge", name="merge", after=["p0", "p1"])
    g.add("q", "page", name="p0")
    g.add("q", "page", name="p1", after=[Dep(7, After.FINISHED)])
    plan = g.plan()
    assert [n.name for n in plan.nodes] == ["p0", "p1", "merge"]
    assert plan.external == [7]
    assert {(e.child, e.parent, e.job_id, e.after) for e in plan.edges} == {
        (1, None, 7, After.FINISHED),
        (2, 0, None, After.SUCCEEDED),
        (2, 1, None, After.SUCCEEDED),
    }


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda g: g.add("q", "a", name="a", after=["a"]), "node 'a' waits for itself"),
        (lambda g: g.add("q", "a", name="a", after=["b"]), "node 'a' waits for unknown node 'b'"),
        (lambda g: g.add("q", "a", name="a", after=[3, 3]), "node 'a' waits for 3 twice"),
        (lambda g: g.add("q", "a", name="a", after=[0]), "waits for job 0, not a job id"),
        (lambda g: g.add("q", "a", name="a", after=[True]), "pass a node, its name, or a job id"),
    ],
)
def test_bad_edges_are_refused_naming_the_node(build: object, problem: str) -> None:
    g = Graph()
    build(g)  # type: ignore[operator]
    with pytest.raises(leaseq.InvalidGraph, match=problem):
        g.plan()


def test_a_cycle_is_named_and_nodes_outside_it_do_not_matter() -> None:
    g = Graph()
    g.add("q", "x", name="x")
    g.add("q", "a", name="a", after=["x", "b"])
    g.add("q", "b", name="b", after=["a"])
    g.add("q", "after-the-cycle", name="c", after=["b"])
    with pytest.raises(leaseq.InvalidGraph, match=r"cycle: (a -> b -> a|b -> a -> b)"):
        g.plan()


def test_names_are_unique_within_a_graph_and_across_included_graphs() -> None:
    g = Graph()
    g.add("q", "a", name="a")
    with pytest.raises(leaseq.InvalidGraph, match="two nodes have the name 'a'"):
        g.add("q", "a", name="a")
    other = Graph()
    other.add("q", "a", name="a")
    with pytest.raises(leaseq.InvalidGraph, match=r"named \['a'\]"):
        g.include(other)
    with pytest.raises(leaseq.InvalidGraph, match="no jobs"):
        Graph().plan()


def test_a_node_name_passed_as_the_flow_key_is_named_in_the_error() -> None:
    # key= named the node before it became the flow key: a node that waits for such a
    # "name" is refused, saying which argument names a node.
    g = Graph()
    g.add("q", "page", key="page-1")
    g.add("q", "merge", name="merge", after=["page-1"])
    hint = r"'page-1' is a flow key, key=; a node is named with name="
    with pytest.raises(leaseq.InvalidGraph, match=hint):
        g.plan()


def test_flow_keys_default_to_inherit_and_none_opts_out() -> None:
    g = Graph()
    g.add("q", "a", name="a")
    g.add("q", "b", name="b", key=None)
    g.add("q", "c", name="c", key="tenant-A")
    assert [n.key for n in g.plan().nodes] == [leaseq.INHERIT, None, "tenant-A"]
    with pytest.raises(leaseq.InvalidGraph, match="key 7 is not a flow key"):
        g.add("q", "d", key=7)  # type: ignore[arg-type]
