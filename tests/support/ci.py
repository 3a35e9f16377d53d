"""The checks CI runs between the README's test setup and its test command, as .ci/run writes
them. tests/unit/test_ci.py keeps this list and .ci/run the same; tests/fresh runs each one in
a fresh virtualenv after the README's setup, so a contributor's editable install runs them too."""

from __future__ import annotations

CI_CHECKS = (
    "ruff check .",
    "ruff format --check .",
    "python -m mypy",
    "lint-imports",
)
