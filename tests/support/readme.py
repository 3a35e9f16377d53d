"""Shell blocks of README.md, for the tests that run them as written (the test setup, the
quickstart) and keep CI running the same commands."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def sh_blocks(heading: str, readme: str | None = None) -> list[str]:
    """The ``sh`` code blocks of the README section that starts with ``heading``."""
    text = README.read_text() if readme is None else readme
    section = text[text.index(heading) + len(heading) :]
    section = section[: section.find("\n## ")] if "\n## " in section else section
    blocks = []
    for part in section.split("```sh\n")[1:]:
        blocks.append(part[: part.index("```")])
    return blocks


def readme_test_commands(readme: str | None = None) -> list[str]:
    """The commands of the first ``sh`` block under "## Running the tests", one per line,
    without comments."""
    block = sh_blocks("## Running the tests", readme)[0]
    lines = (line.split(" #")[0].strip() for line in block.splitlines())
    return [line for line in lines if line and not line.startswith("#")]
