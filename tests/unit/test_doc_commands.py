"""Every `leaseq ...` command the documentation shows parses with the real argument parser:
README.md, every page of the site in docs/, the chart's README and NOTES.txt, and the alert
runbooks (whose text ends up in the PrometheusRule and Grafana annotations a paged operator
reads)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from leaseq.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
# docs/reference/cli.md is generated from the parsers themselves (its headings and usage lines
# are not commands to run); tests/unit/test_reference.py keeps it current instead.
GENERATED_FROM_PARSERS = {"docs/reference/cli.md"}
SITE = sorted(
    str(p.relative_to(ROOT))
    for p in (ROOT / "docs").rglob("*.md")
    if str(p.relative_to(ROOT)) not in GENERATED_FROM_PARSERS
)
DOCS = [
    "README.md",
    *SITE,
    "charts/leaseq/README.md",
    "charts/leaseq/templates/NOTES.txt",
    "charts/leaseq/alerts/leaseq.rules.yaml",
]
# Placeholders the docs may use, and a value of the right type for each.
PLACEHOLDERS = {
    "ID": "42",
    "QUEUE": "ocr",
    "<queue>": "ocr",
    "TYPE": "extract",
    "JSON": "{}",
    "URL": "postgresql://host/db",
}
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _commands_in(text: str) -> list[str]:
    """The ``leaseq ...`` commands in a shell snippet: one per `&&`, `|` or `;` part, leading
    VAR=value assignments and trailing comments dropped."""
    found = []
    text = text.replace("\\\n", " ")
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line)
        for part in re.split(r"&&|\|\||\||;", line):
            words = part.split()
            while words and _ASSIGNMENT.match(words[0]):
                words.pop(0)
            if words[:1] == ["leaseq"] and len(words) > 1:
                found.append(" ".join(words))
    return found


def documented_commands(path: Path) -> list[str]:
    """Commands in fenced code blocks, in `code spans`, and on indented lines of NOTES.txt."""
    text = path.read_text()
    commands = []
    for block in _FENCE.findall(text):
        commands += _commands_in(block)
    prose = _FENCE.sub("", text)
    for span in _SPAN.findall(prose):
        commands += _commands_in(" ".join(span.split()))
    if path.suffix == ".txt":
        indented = [line for line in prose.splitlines() if line[:1].isspace()]
        commands += [c for line in indented for c in _commands_in(line)]
    return commands


def _argv(command: str) -> list[str]:
    words = shlex.split(command.replace("[", "").replace("]", ""))[1:]
    return [PLACEHOLDERS.get(w, w) for w in words]


def parse(command: str) -> None:
    """Parse like `leaseq` does (the operator's flags by the operator's own parser)."""
    argv = _argv(command)
    if argv[:1] == ["operator"]:
        from leaseq_operator.cli import build_parser as operator_parser

        operator_parser().parse_args(argv[1:])
    else:
        build_parser().parse_args(argv)


ALL = sorted({(doc, c) for doc in DOCS for c in documented_commands(ROOT / doc)})


def test_the_docs_show_commands_at_all() -> None:
    """Guard against an extractor that silently finds nothing."""
    by_doc = {doc: [c for d, c in ALL if d == doc] for doc in DOCS}
    assert len(by_doc["README.md"]) >= 10, by_doc["README.md"]
    assert len(SITE) >= 20, SITE
    assert sum(len(by_doc[page]) for page in SITE) >= 30
    for page in ("docs/guides/without-kubernetes.md", "docs/operations/commands.md"):
        assert len(by_doc[page]) >= 3, (page, by_doc[page])
    assert len(by_doc["charts/leaseq/alerts/leaseq.rules.yaml"]) >= 2


@pytest.mark.parametrize(("doc", "command"), ALL, ids=[f"{d}: {c}" for d, c in ALL])
def test_documented_command_parses(
    doc: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code: object = 0
    try:
        parse(command)
    except SystemExit as exc:  # argparse's way of refusing (or of printing --help)
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 0, f"{doc}: `{command}` does not parse: {err[-1] if err else code}"


def test_a_wrong_command_is_caught() -> None:
    with pytest.raises(SystemExit):
        parse("leaseq jobs --status running")


SOURCES = sorted(
    p for top in ("worker/leaseq", "operator/leaseq_operator") for p in (ROOT / top).rglob("*.py")
)
_NAMED = re.compile(r"`(leaseq [a-z][^`\n]*)`")


def not_a_command(command: str) -> str | None:
    """Why a `leaseq ...` span names no command (None when it does). Its words are followed
    down the subcommands while they are ones; arguments may be left out (an error message
    says `leaseq retry` without the ID it takes), and ``a/b`` names each of a and b."""
    parser: argparse.ArgumentParser = build_parser()
    for word in command.split()[1:]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return None
        choices = subs[0].choices
        if word.split("/")[0] not in choices:
            return f"{word!r} is not a command here" if subs[0].required else None
        if unknown := [w for w in word.split("/") if w not in choices]:
            return f"{unknown} are not commands here"
        parser = choices[word.split("/")[0]]
    return None


def test_the_messages_of_the_code_name_real_commands() -> None:
    """Errors, logs and docstrings that tell a user to run `leaseq ...` name a command that
    exists (the dead-job error said `leaseq show`, which does not)."""
    named = sorted(
        {(str(p.relative_to(ROOT)), c) for p in SOURCES for c in _NAMED.findall(p.read_text())}
    )
    assert len(named) >= 10, named
    wrong = [f"{src}: `{c}`: {why}" for src, c in named if (why := not_a_command(c))]
    assert wrong == []
