"""The security guide's threat-model table is rendered from the file the attack suite reads."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_hooks  # noqa: E402


def test_the_guide_marks_where_the_table_goes_and_every_relation_is_in_it() -> None:
    guide = (ROOT / "docs" / "guides" / "security.md").read_text()
    model = tomllib.loads(docs_hooks.THREAT_MODEL.read_text())
    rendered = docs_hooks.on_page_markdown(guide, None, None, None)
    assert docs_hooks.MARKER in guide and docs_hooks.MARKER not in rendered
    for name in model["relations"]:
        assert f"| `{name}` |" in rendered, name
    for name in model["functions"]:
        assert f"`{name}` (" in rendered, name
