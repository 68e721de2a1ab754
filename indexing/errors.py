"""Exceptions raised by :mod:`indexing`."""

from __future__ import annotations

__all__ = ["IndexInputError", "IndexStoreError"]


class IndexInputError(ValueError):
    """An argument handed to the index is unusable.

    The message always starts with the name of the offending input (for example
    ``vectors[3]``, ``ids[7]``, ``k``) followed by what is wrong with it.
    """


class IndexStoreError(RuntimeError):
    """The on-disk store cannot be used (unknown format version, meta mismatch)."""
