"""Fixtures for the chart tests: a copy of the chart (with the CRD stand-in when needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chartkit import Helm, chart_copy, tool


@pytest.fixture(scope="session")
def chart(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    """(chart directory to render, whether it carries the real WorkerPool CRD)."""
    return chart_copy(tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="session")
def real_crd(chart: tuple[Path, bool]) -> bool:
    return chart[1]


@pytest.fixture
def helm(chart: tuple[Path, bool]) -> Helm:
    """helm on the chart copy; skips when helm is not installed."""
    return Helm(tool("helm"), chart[0])
