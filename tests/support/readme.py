"""README.md's "Running the tests" commands, for the tests that keep CI and a fresh machine
running exactly them."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_test_commands(readme: str | None = None) -> list[str]:
    """The commands of the first ``sh`` block under "## Running the tests", one per line,
    without comments."""
    text = README.read_text() if readme is None else readme
    section = text[text.index("## Running the tests") :]
    start = section.index("```sh\n") + len("```sh\n")
    block = section[start : section.index("```", start)]
    lines = (line.split(" #")[0].strip() for line in block.splitlines())
    return [line for line in lines if line and not line.startswith("#")]
