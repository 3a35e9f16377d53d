"""The benchmarks page's headline table is generated from the committed CSV, never typed."""

from __future__ import annotations

from pathlib import Path

from bench import report
from bench.__main__ import HEADLINE_PAGE

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_headline_is_generated_from_the_committed_results() -> None:
    assert HEADLINE_PAGE == ROOT / "docs" / "benchmarks" / "index.md"
    page = HEADLINE_PAGE.read_text()
    start = page.index(report.README_START) + len(report.README_START)
    end = page.index(report.README_END)
    assert page[start:end] == report.readme_section(ROOT / "bench" / "results"), (
        "docs/benchmarks/index.md's table is stale: run `python -m bench report`"
    )


def test_the_readme_links_the_benchmarks_page() -> None:
    assert "](docs/benchmarks/index.md)" in (ROOT / "README.md").read_text()
