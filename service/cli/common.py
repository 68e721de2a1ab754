"""What every ``hypsearch`` command shares: the parser class, argument types,
the ``--json``/``--quiet`` options, output, and the checks of named files."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import EXIT_USAGE, CliError

__all__ = [
    "Parser",
    "add_common",
    "emit",
    "given",
    "home",
    "need_file",
    "need_path",
    "nonneg_float",
    "nonneg_int",
    "positive_float",
    "positive_int",
    "subcommands",
]


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage is one ``--help`` away)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def subcommands(sub, name: str, help: str, dest: str):
    """A command ``name`` whose work is in its subcommands (``hypsearch labels train``)."""
    return sub.add_parser(name, help=help).add_subparsers(
        dest=dest, metavar="SUBCOMMAND", required=True, parser_class=Parser
    )


def add_common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")


def home() -> Path:
    return Path(os.environ.get("HYPSEARCH_HOME", "var")).resolve()


def emit(args: argparse.Namespace, result: dict, human: Callable[[dict], str]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(result, sort_keys=True))
    else:
        print(human(result))


def given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The options among ``names`` that were given (not ``None``), by name."""
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def need_path(flag: str, path: str) -> Path:
    """``path`` when it exists (a file or a folder), else a :class:`CliError`."""
    if not Path(path).exists():
        raise CliError(f"{flag} {path}: no such file")
    return Path(path)


def need_file(flag: str, path: str) -> Path:
    """``path`` when it is a file, else a :class:`CliError`."""
    if not Path(path).is_file():
        raise CliError(f"{flag} {path}: no such file")
    return Path(path)


def _number(kind: type, *, positive: bool) -> Callable[[str], int | float]:
    """An argparse type: an int or a finite float, > 0 (``positive``) or >= 0."""
    noun = "an integer" if kind is int else "a number"

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if kind is int:
            ok, need = (
                (v >= 1, "must be at least 1") if positive else (v >= 0, "must be at least 0")
            )
        else:
            finite = v != float("inf")
            ok = (v > 0 if positive else v >= 0) and finite
            need = "must be a positive number" if positive else "must be a non-negative number"
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r} {need}")
        return v

    return parse


positive_int = _number(int, positive=True)
nonneg_int = _number(int, positive=False)
positive_float = _number(float, positive=True)
nonneg_float = _number(float, positive=False)
