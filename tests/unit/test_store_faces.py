"""Each face's store class runs the statements of its own file only: the console's those of
console.sql, flow control's flow.sql, schedules' schedules.sql. They share with the job
store nothing but the Runner that loads and runs statements (the one place a psycopg error
is translated), so none of them carries the job store's methods."""

from __future__ import annotations

from importlib import resources

import pytest

from leaseq.core._store import statements
from leaseq.core._store.console import BulkAction, ConsoleStore
from leaseq.core._store.flow import FlowStore
from leaseq.core._store.runner import Runner
from leaseq.core._store.schedules import ScheduleStore
from leaseq.core._store.store import Store

#: Methods that run several statements of their file, chosen by an enum of them.
DIRECTED = {"console_bulk": {a.value for a in BulkAction}}


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


@pytest.mark.parametrize(
    ("cls", "file"),
    [(ConsoleStore, "console.sql"), (FlowStore, "flow.sql"), (ScheduleStore, "schedules.sql")],
)
def test_a_face_store_has_the_methods_of_its_own_statements_only(cls: type, file: str) -> None:
    text = resources.files("leaseq_sql").joinpath("queries", file).read_text(encoding="utf-8")
    own = set(statements.parse(text))
    assert cls.__mro__ == (cls, Runner, object)
    methods = _public(cls)
    assert methods - own - DIRECTED.keys() == set()
    for method in methods & DIRECTED.keys():
        assert DIRECTED[method] <= own, method
    assert methods & _public(Store) == set()
