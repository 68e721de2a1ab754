"""Words of a taxonomy's nodes: word -> node resolution, autocompletion, suggestions.

:class:`WordIndex` is built from plain data (node names, WordNet lemmas and
word index when the taxonomy came from WordNet); :class:`models.taxonomy.graph.Taxonomy`
builds one lazily and answers ``senses``, ``resolve``, ``complete`` and
``suggest`` through it. Plural forms (WordNet morphology) are
:class:`models.taxonomy.wordnet.WordResolver`'s job.
"""

from __future__ import annotations

import difflib
import heapq
import re
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence

from models.taxonomy.base import UnknownLabelError, gc_paused, norm

__all__ = ["WordIndex", "word_of_name"]

_SYNSET_NAME = re.compile(r"^(.+)\.([a-z])\.(\d+)$")


def word_of_name(name: str) -> tuple[str, int]:
    """Word and sense rank derived from a node name (``gym_shoe.n.01`` -> ``gym_shoe``, 1)."""
    m = _SYNSET_NAME.match(name)
    if m:
        return m.group(1), int(m.group(3))
    return name, 0


class WordIndex:
    """Lookup key -> node names carrying that word (in sense order), and the
    vocabulary of node names and words for completion and suggestions.

    ``src`` is a WordNet word index (word -> synsets, sense order) with
    ``lemmas`` (synset -> words); without it every node carries the word of
    its name (:func:`word_of_name`).
    """

    __slots__ = ("_names", "_index", "table", "_lower_names", "_vocab")

    def __init__(
        self,
        names: Sequence[str],
        index: Mapping[str, int],
        lemmas: Mapping[str, list[str]] | None,
        src: Mapping[str, Sequence[str]] | None,
    ) -> None:
        self._names = names
        self._index = index
        with gc_paused():
            self.table: dict[str, tuple[str, ...]] = _build_table(names, index, lemmas, src)
        self._lower_names: dict[str, str | None] | None = None
        self._vocab: tuple[list[str], list[str], dict[str, int]] | None = None

    def senses(self, word: str) -> list[str]:
        """Nodes carrying *word* (any case, spaces or ``_``), in sense order."""
        return list(self.table.get(norm(word), ()))

    def resolve(self, text: str, prefer: Callable[[str], float] | None = None) -> str:
        """Node name for *text*: an exact node name, else a word or phrase
        (see :meth:`models.taxonomy.graph.Taxonomy.resolve`)."""
        if not isinstance(text, str):
            raise TypeError(f"label must be a string, got {type(text).__name__}")
        t = text.strip()
        if t in self._index:
            return t
        key = norm(t)
        cands = self.table.get(key)
        if not cands:
            if self._lower_names is None:
                lower: dict[str, str | None] = {}
                for n in self._names:
                    k = norm(n)
                    lower[k] = None if k in lower else n  # None: ambiguous
                self._lower_names = lower
            hit = self._lower_names.get(key)
            if hit is not None:
                return hit
            raise UnknownLabelError(text, self.suggest(text))
        if prefer is None or len(cands) == 1:
            return cands[0]
        best_i, best_s = 0, None
        for i, n in enumerate(cands):
            s = float(prefer(n))
            if s != s:  # NaN never wins
                continue
            if best_s is None or s > best_s:
                best_i, best_s = i, s
        return cands[best_i]

    def _vocabulary(self) -> tuple[list[str], list[str], dict[str, int]]:
        """(sorted lookup keys, display strings, display -> number of senses)."""
        if self._vocab is None:
            with gc_paused():
                entries: dict[str, int] = {}
                for k, syns in self.table.items():
                    entries[k] = len(syns)
                for n in self._names:
                    entries.setdefault(n, 0)
                pairs = []
                for d in entries:
                    k = norm(d)
                    pairs.append((d if k == d else k, d))
                pairs.sort()
                self._vocab = ([k for k, _ in pairs], [d for _, d in pairs], entries)
        return self._vocab

    def complete(self, prefix: str, limit: int = 20) -> list[str]:
        """Node names and words starting with *prefix* (see
        :meth:`models.taxonomy.graph.Taxonomy.complete`)."""
        if limit <= 0:
            return []
        keys, display, senses = self._vocabulary()
        p = norm(prefix)
        lo = bisect_left(keys, p)
        hi = bisect_left(keys, p + "\U0010ffff", lo)
        return heapq.nsmallest(limit, display[lo:hi], key=lambda d: (len(d), -senses[d], d))

    def suggest(self, text: str, n: int = 5) -> list[str]:
        """Close matches for *text* among node names and words (difflib), best first."""
        keys, display, _ = self._vocabulary()
        key = norm(text)
        if not key:
            return []
        result: list[str] = []
        for m in difflib.get_close_matches(key, keys, n=n, cutoff=0.75):
            d = display[bisect_left(keys, m)]
            if d not in result:
                result.append(d)
        if len(result) < n:
            for c in self.complete(key, limit=n):
                if c not in result:
                    result.append(c)
        return result[:n]


def _build_table(names, index, lemmas, src) -> dict[str, tuple[str, ...]]:
    """The lookup table of :class:`WordIndex` (WordNet index, else node names)."""
    out: dict[str, tuple[str, ...]] = {}
    if src is not None:
        for w, syns in src.items():
            present = tuple(s for s in syns if s in index)
            if present:
                out[norm(w)] = present
        # lemmas never listed in the index (not expected for WordNet)
        if lemmas is not None:
            for n, ws in lemmas.items():
                for w in ws:
                    k = norm(w)
                    if n not in out.get(k, ()):
                        out[k] = out.get(k, ()) + (n,)
    else:
        grouped: dict[str, list[tuple[int, str]]] = {}
        for n in names:
            w, rank = word_of_name(n)
            grouped.setdefault(norm(w), []).append((rank, n))
        for k, lst in grouped.items():
            lst.sort()
            out[k] = tuple(n for _, n in lst)
    return out
