"""What a newcomer reads first: `leaseq --help`, `leaseq --version` and each command's help."""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys

import pytest

from leaseq.cli.main import build_parser


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command parser by its full name, e.g. ``jobs list``."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                found.update({f"{name} {k}": v for k, v in _commands(sub).items()})
    return found


def test_version_is_the_installed_one() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "leaseq.cli", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"leaseq {importlib.metadata.version('leaseq')}"


def test_top_level_help_is_plain_text() -> None:
    text = build_parser().format_help()
    for markup in ("``", ":class:", ":func:", "::"):
        assert markup not in text
    assert "--version" in text


@pytest.mark.parametrize("name", ["migrate", "demo", "worker", "status", "jobs", "jobs show"])
def test_commands_have_a_description(name: str) -> None:
    parser = _commands(build_parser())[name]
    assert parser.description, f"`leaseq {name} --help` has no description"
    assert "``" not in parser.format_help()


def test_listen_says_which_values_it_takes() -> None:
    text = " ".join(_commands(build_parser())["worker"].format_help().split())
    assert "--listen LISTEN true or false" in text


@pytest.mark.parametrize("value", ["-1", "0", "soon"])
def test_status_watch_refuses_a_refresh_interval_that_is_not_positive(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["status", "--watch", value])
    assert caught.value.code == 2
    assert "not a number of seconds greater than 0" in capsys.readouterr().err
