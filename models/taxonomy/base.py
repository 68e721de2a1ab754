"""What the taxonomy modules share: their errors, the word lookup key, a GC pause.

A leaf module (standard library only): :mod:`models.taxonomy.graph`,
:mod:`models.taxonomy.tsv`, :mod:`models.taxonomy.words` and
:mod:`models.taxonomy.wordnet` all import it, and it imports none of them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

__all__ = ["EdgeError", "TaxonomyError", "UnknownLabelError", "gc_paused", "norm"]


class TaxonomyError(ValueError):
    """A taxonomy could not be built or loaded (one-line message)."""


class UnknownLabelError(TaxonomyError):
    """A label (node name or word) is not in the taxonomy.

    ``text`` is the text asked for, ``suggestions`` close matches (node names
    or words, best first; possibly empty).
    """

    def __init__(self, text: str, suggestions: Iterable[str] = (), what: str = "label"):
        self.text = text
        self.suggestions = list(suggestions)
        self.what = what
        msg = f"unknown {what} {text!r}"
        if self.suggestions:
            msg += "; did you mean: " + ", ".join(self.suggestions)
        super().__init__(msg)

    def __reduce__(self):
        return (type(self), (self.text, self.suggestions, self.what))


class EdgeError(TaxonomyError):
    """An error about one edge, so that file loaders can add a line number."""

    def __init__(self, message: str, edge: tuple[str, str]):
        super().__init__(message)
        self.edge = edge


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many small acyclic containers.

    With a large heap (the WordNet graph) every automatic collection walks
    millions of objects; pausing it roughly halves build times.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def norm(text: str) -> str:
    """Lookup key of a word or phrase: lowercase, whitespace runs -> ``_``."""
    return "_".join(text.strip().lower().split())
