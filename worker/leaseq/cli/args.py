"""What the CLI's command modules share: argument types for argparse, the connection a
command opens from its arguments, and its answer (a line of text, or JSON with ``--json``)."""

from __future__ import annotations

import argparse
from typing import Any

from leaseq import config as settings
from leaseq.cli.tables import to_json
from leaseq.core import validation
from leaseq.core.db import Conn, connect
from leaseq.core.errors import InvalidJob


def duration(text: str) -> float:
    """Seconds from ``90s``, ``30min``, ``12h``, ``7d`` or ``2w`` (:func:`leaseq.config.duration`:
    ``m`` is refused, it could be minutes or months)."""
    try:
        return settings.duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def days(text: str) -> int:
    """A whole number of days from ``7d``, ``2w`` or ``30`` (days)."""
    try:
        seconds = settings.duration(text if text.strip()[-1:].isalpha() else f"{text}d")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds < 86400 or seconds % 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of days (e.g. 7d, 2w)")
    return int(seconds // 86400)


def seconds(text: str) -> float:
    """A number of seconds greater than zero (``--watch 0.5``)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds greater than 0")
    return value


def json_argument(text: str) -> Any:
    """``text`` parsed as JSON (:func:`leaseq.core.validation.json_text`); argparse's error
    names the argument when it is no JSON or nests too deeply to be read."""
    try:
        return validation.json_text("argument", text)
    except InvalidJob as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def connect_for(args: argparse.Namespace, action: str) -> Conn:
    values = settings.resolve(args, [settings.DATABASE_URL])
    return connect(settings.require(values, settings.DATABASE_URL), action=action)


def say(args: argparse.Namespace, value: Any, text: str) -> None:
    print(to_json(value) if args.json else text)
