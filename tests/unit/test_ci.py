"""CI runs README.md's test setup and test command exactly as written there."""

from __future__ import annotations

from pathlib import Path

from support.readme import readme_test_commands

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_commands_literally_and_in_order() -> None:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = readme_test_commands()
    assert len(commands) == 2, commands
    positions = [lines.index(c) if c in lines else -1 for c in commands]
    assert -1 not in positions, f".ci/run does not run {commands} as written in README.md"
    assert positions == sorted(positions)
