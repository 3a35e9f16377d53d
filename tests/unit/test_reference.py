"""The documentation's generated pages (CLI, configuration, Python API, alerts, dashboard) are
what scripts/docs_reference.py makes from the code today, and the README stays a front door."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
GENERATOR = runpy.run_path(str(ROOT / "scripts" / "docs_reference.py"))
README_LIMIT = 12 * 1024


@pytest.mark.parametrize("page", sorted(GENERATOR["PAGES"]))
def test_generated_page_is_current(page: str) -> None:
    render = GENERATOR["PAGES"][page]
    assert (ROOT / page).read_text() == render(), (
        f"{page} is stale: run `python scripts/docs_reference.py`"
    )


def test_the_stale_check_names_a_page_that_drifted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check compares text, so a flag added to a parser (here: one row edited away)
    shows up as a stale page."""
    page = "docs/reference/configuration.md"
    copy = tmp_path / page
    copy.parent.mkdir(parents=True)
    text = (ROOT / page).read_text()
    copy.write_text(text.replace("| `--lease-seconds` |", "| `--lease-secs` |"))
    stale = GENERATOR["stale"]
    monkeypatch.setitem(stale.__globals__, "ROOT", tmp_path)
    assert page in stale()


def test_every_setting_and_command_is_documented() -> None:
    configuration = (ROOT / "docs/reference/configuration.md").read_text()
    cli = (ROOT / "docs/reference/cli.md").read_text()
    for variable in ("LEASEQ_DATABASE_URL", "LEASEQ_ISOLATION", "LEASEQ_LEADER_TTL_SECONDS"):
        assert f"`{variable}`" in configuration
    for command in ("leaseq worker", "leaseq jobs show", "leaseq reaper", "leaseq operator"):
        assert f"## `{command}`" in cli


def test_readme_is_a_front_door_of_at_most_12_kb() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail to docs/"
