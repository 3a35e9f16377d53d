"""The README's configuration tables are generated from the settings declarations."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_configuration_tables_are_current() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- CONFIGURATION -->\n") + len("<!-- CONFIGURATION -->\n")
    end = readme.index("<!-- /CONFIGURATION -->")
    tables = runpy.run_path(str(ROOT / "scripts" / "readme_config.py"))["tables"]()
    assert readme[start:end].strip() == tables, (
        "README configuration tables are stale: paste `python scripts/readme_config.py`"
    )
