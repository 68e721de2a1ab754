"""The CLI's user errors: one line on stderr, exit status 2."""

from __future__ import annotations

EXIT_USAGE = 2

__all__ = ["EXIT_USAGE", "CliError", "user_errors"]


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that are the user's input at fault (exit 2, one line)."""
    from models.checkpoint import CheckpointError
    from models.images.datasets import DataError
    from models.taxonomy.graph import TaxonomyError

    return (CliError, TaxonomyError, CheckpointError, DataError)
