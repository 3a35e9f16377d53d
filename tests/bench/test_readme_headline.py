"""The README's benchmark table is generated from the committed CSV, never typed."""

from __future__ import annotations

from pathlib import Path

from bench import report

ROOT = Path(__file__).resolve().parents[2]


def test_readme_headline_is_generated_from_the_committed_results() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index(report.README_START) + len(report.README_START)
    end = readme.index(report.README_END)
    assert readme[start:end] == report.readme_section(ROOT / "bench" / "results"), (
        "README benchmark table is stale: run `python -m bench report`"
    )
