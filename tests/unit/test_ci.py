"""CI runs README.md's test setup and test command exactly as written there, and between them
the checks that tests/fresh also runs after the README's setup (tests/support/ci.py)."""

from __future__ import annotations

from pathlib import Path

from support.ci import CI_CHECKS
from support.readme import readme_test_commands

ROOT = Path(__file__).resolve().parents[2]


def _ci_lines() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]


def test_ci_runs_the_readme_test_commands_literally_and_in_order() -> None:
    lines = _ci_lines()
    commands = readme_test_commands()
    assert len(commands) == 2, commands
    positions = [lines.index(c) if c in lines else -1 for c in commands]
    assert -1 not in positions, f".ci/run does not run {commands} as written in README.md"
    assert positions == sorted(positions)


def test_ci_runs_each_check_the_fresh_setup_test_runs_between_setup_and_tests() -> None:
    lines = _ci_lines()
    setup, test = (lines.index(c) for c in readme_test_commands())
    missing = [check for check in CI_CHECKS if check not in lines]
    assert missing == [], f".ci/run does not run {missing} (tests/support/ci.py lists them)"
    positions = [lines.index(check) for check in CI_CHECKS]
    assert setup < min(positions) and max(positions) < test, positions
