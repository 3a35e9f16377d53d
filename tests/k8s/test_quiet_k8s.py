"""An idle operator logs nothing at INFO (issue 17): in a pod the kubelet probes /healthz every
few seconds and the reaper passes every interval; neither may leave a line per probe or pass
(kopf's "Activity 'reaper' succeeded.", aiohttp's access line)."""

from __future__ import annotations

import logging

import pytest
from harness import StartOperator

from support import net
from support.polling import wait_for

pytestmark = pytest.mark.k8s


def test_an_idle_operator_logs_nothing_at_info(
    start_operator: StartOperator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    port = net.free_port()
    operator = start_operator(health_port=port)
    wait_for(lambda: operator.app.leading, what="the reaper leads")
    passes: list[bool] = []
    operator.app.reaper.on_leading = passes.append  # one call per reaper pass
    # Start-up lines are fine, and so is the first pass's work (it creates the days of
    # history partitions ahead); from the next pass on the operator is idle.
    wait_for(lambda: len(passes) >= 2, what="the first reaper passes")
    caplog.clear()
    passes.clear()
    for _ in range(5):  # as the kubelet's liveness probe does
        status, body = net.get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200, body
    wait_for(lambda: len(passes) >= 5, what="five idle reaper passes")
    lines = [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.INFO and not _emulators(r)
    ]
    assert lines == []


def _emulators(record: logging.LogRecord) -> bool:
    """An access line of the emulated API server (an aiohttp server in this process too):
    the operator serves /healthz only, the API server never."""
    return record.name == "aiohttp.access" and '"GET /healthz ' not in record.getMessage()
