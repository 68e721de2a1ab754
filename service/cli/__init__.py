"""The ``hypsearch`` command: it parses arguments and calls into models, indexing and service.

Bad input exits 2 with one line on stderr that names the input and what is
wrong; long work shows a progress bar on stderr; ``--json`` prints one JSON
object on stdout.

One module a command group: :mod:`.taxonomy` (``taxonomy``, ``labels``),
:mod:`.hyperbolicity`, :mod:`.training` (``train``, ``eval``), :mod:`.index`
(``index build``), :mod:`.serving` (``serve``, ``demo``); :mod:`.common` holds
what they share and :mod:`.errors` the user errors.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import hyperbolicity, index, serving, taxonomy, training
from .common import Parser
from .errors import EXIT_USAGE, CliError, user_errors

__all__ = ["EXIT_USAGE", "CliError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hypsearch",
        description="Hierarchical image retrieval in hyperbolic space.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    taxonomy.add_commands(sub)  # taxonomy, labels
    hyperbolicity.add_commands(sub)
    training.add_commands(sub)  # train, eval
    serving.add_serve(sub)
    index.add_commands(sub)  # index build, embed
    serving.add_demo(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    errors = user_errors()
    try:
        return int(args.func(args) or 0)
    except errors as e:
        print(f"hypsearch: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("hypsearch: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"hypsearch: error: {where}{e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
