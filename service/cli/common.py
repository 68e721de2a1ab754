"""What every ``hypsearch`` command shares: the parser class, the
``--json``/``--quiet`` options, output, and the checks of named files."""

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
    "command",
    "emit",
    "given",
    "home",
    "need_file",
    "need_path",
    "subcommands",
]


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage is one ``--help`` away)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def command(sub, name: str, func: Callable, help: str, description: str | None = None):
    """Add the command ``name`` that runs ``func(args)``; its parser, for its options."""
    sp = sub.add_parser(name, help=help, description=description)
    sp.set_defaults(func=func)
    return sp


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


def emit(args: argparse.Namespace, result: dict, human: Callable[[dict], str]) -> int:
    """Print ``result`` (one JSON object with ``--json``, else ``human(result)``); 0."""
    if getattr(args, "json", False):
        print(json.dumps(result, sort_keys=True))
    else:
        print(human(result))
    return 0


def given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The options among ``names`` that were given (not ``None``), by name."""
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def need_path(flag: str, path: str) -> Path:
    """``path`` when it exists (a file or a folder), else a :class:`CliError`."""
    if not Path(path).exists():
        raise CliError(f"{flag} {path}: no such file")
    return Path(path)


def need_model(flag: str, spec: str) -> None:
    """A model checkpoint that is a file, or a built-in ``pretrained:NAME`` (checked at load)."""
    if not spec.startswith("pretrained:"):
        need_file(flag, spec)


def need_file(flag: str, path: str) -> Path:
    """``path`` when it is a file, else a :class:`CliError`."""
    if not Path(path).is_file():
        raise CliError(f"{flag} {path}: no such file")
    return Path(path)
