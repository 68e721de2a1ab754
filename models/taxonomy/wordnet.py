"""Reader for the WordNet 3.0 noun database (``data.noun`` / ``index.noun``).

No NLTK: the two database files are parsed with plain string operations
(about a second for all 82,115 noun synsets).

Synsets are named exactly as NLTK names them: ``lemma.n.NN`` where ``lemma`` is
the synset's first lemma, lowercased, and ``NN`` is the 1-based, two-digit
position of the synset's offset in that lemma's offset list in ``index.noun``
(NLTK's sense number), e.g. ``gym_shoe.n.01``, ``jersey.n.03``, ``dog.n.01``.

The hierarchy edges are the ``@`` (hypernym) and ``@i`` (instance hypernym)
pointers of ``data.noun``.

Besides the nouns: WordNet's morphology for nouns (``noun.exc`` and the
suffix rules of ``morphy``), which :class:`WordResolver` tries when a word is
not a node's word (``sneakers`` -> ``sneaker``).  This module knows nothing
of :class:`models.taxonomy.graph.Taxonomy`, which builds on it
(:meth:`~models.taxonomy.graph.Taxonomy.from_wordnet`, :func:`~models.taxonomy.graph.with_words`).

File formats: https://wordnet.princeton.edu/documentation/wndb5wn
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from models.taxonomy.base import TaxonomyError, UnknownLabelError, gc_paused

__all__ = ["DEFAULT_WORDNET_DIR", "WordNetNouns", "WordResolver", "load_wordnet_nouns"]

DEFAULT_WORDNET_DIR = "/usr/share/wordnet"

_HYPERNYM_SYMBOLS = frozenset(("@", "@i"))


@dataclass(eq=False)
class WordNetNouns:
    """The WordNet noun database, keyed by NLTK-style synset names.

    ``names``       every noun synset, in ``data.noun`` (byte offset) order.
    ``parents``     synset -> direct hypernyms and instance hypernyms, in file order.
    ``lemmas``      synset -> its lemma words as written in the file
                    (e.g. ``['gym_shoe', 'sneaker', 'tennis_shoe']``).
    ``word_index``  lowercased word (``_`` for spaces) -> synsets carrying it, in
                    WordNet sense order (``index.noun`` order).
    ``gloss``       synset -> definition text (with examples, as in the file).
    ``offsets``     synset -> its byte offset in ``data.noun`` (the WordNet id).
    """

    names: list[str]
    parents: dict[str, list[str]]
    lemmas: dict[str, list[str]]
    word_index: dict[str, list[str]]
    gloss: dict[str, str]
    offsets: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.lemmas


def _read_lines(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise TaxonomyError(f"WordNet file not found: {path}")
    # WordNet 3.0 is pure ASCII; latin-1 never fails on stray bytes.
    with open(path, encoding="latin-1") as f:
        return f.read().splitlines()


def load_wordnet_nouns(wordnet_dir: str | os.PathLike = DEFAULT_WORDNET_DIR) -> WordNetNouns:
    """Parse ``data.noun`` and ``index.noun`` under *wordnet_dir*.

    Raises :class:`~models.taxonomy.graph.TaxonomyError` naming the path when the
    folder or one of the two files is missing, or when a line cannot be parsed.
    """
    # The parse creates ~10^6 small objects and no reference cycles.
    with gc_paused():
        return _load(os.fspath(wordnet_dir))


def _load(wordnet_dir: str) -> WordNetNouns:
    if not os.path.isdir(wordnet_dir):
        raise TaxonomyError(f"WordNet directory not found: {wordnet_dir}")
    index_path = os.path.join(wordnet_dir, "index.noun")
    data_path = os.path.join(wordnet_dir, "data.noun")
    index_lines = _read_lines(index_path)
    data_lines = _read_lines(data_path)

    # index.noun: lemma pos synset_cnt p_cnt [ptr_symbol...] sense_cnt tagsense_cnt offset...
    word_offsets: dict[str, list[str]] = {}
    for lineno, line in enumerate(index_lines, 1):
        if not line or line[0] == " ":  # licence header lines start with two spaces
            continue
        fields = line.split()
        try:
            n = int(fields[2])
            offsets = fields[len(fields) - n :]
            if n <= 0 or len(fields) < 4 + n:
                raise ValueError
        except (IndexError, ValueError):
            raise TaxonomyError(f"{index_path}:{lineno}: malformed index line") from None
        word_offsets[fields[0]] = offsets

    # data.noun: offset lex_filenum ss_type w_cnt word lex_id ... p_cnt [sym off pos st]... | gloss
    names: list[str] = []
    name_of: dict[str, str] = {}
    raw_parents: list[list[str]] = []
    lemmas: dict[str, list[str]] = {}
    gloss: dict[str, str] = {}
    offsets_of: dict[str, int] = {}
    for lineno, line in enumerate(data_lines, 1):
        if not line or line[0] == " ":
            continue
        head, _, text = line.partition(" | ")
        fields = head.split()
        try:
            offset = fields[0]
            w_cnt = int(fields[3], 16)
            words = fields[4 : 4 + 2 * w_cnt : 2]
            p_at = 4 + 2 * w_cnt
            p_cnt = int(fields[p_at])
            hyper = [
                fields[i + 1]
                for i in range(p_at + 1, p_at + 1 + 4 * p_cnt, 4)
                if fields[i] in _HYPERNYM_SYMBOLS and fields[i + 2] == "n"
            ]
            first = words[0].lower()
            sense = word_offsets[first].index(offset) + 1
        except (IndexError, ValueError, KeyError):
            msg = f"{data_path}:{lineno}: malformed or unindexed synset line"
            raise TaxonomyError(msg) from None
        name = f"{first}.n.{sense:02d}"
        if name in lemmas:
            raise TaxonomyError(f"{data_path}:{lineno}: duplicate synset name {name}")
        names.append(name)
        name_of[offset] = name
        raw_parents.append(hyper)
        lemmas[name] = words
        gloss[name] = text.strip()
        offsets_of[name] = int(offset)

    parents: dict[str, list[str]] = {}
    for name, hyper in zip(names, raw_parents, strict=True):
        try:
            parents[name] = [name_of[o] for o in hyper]
        except KeyError as e:
            raise TaxonomyError(
                f"{data_path}: synset {name} points to unknown hypernym offset {e.args[0]}"
            ) from None

    try:
        word_index = {w: [name_of[o] for o in offs] for w, offs in word_offsets.items()}
    except KeyError as e:
        raise TaxonomyError(f"{index_path}: unknown synset offset {e.args[0]}") from None

    return WordNetNouns(
        names=names,
        parents=parents,
        lemmas=lemmas,
        word_index=word_index,
        gloss=gloss,
        offsets=offsets_of,
    )


# ---------------------------------------------------------------- morphology

#: WordNet's detachment rules for nouns (morphy), tried when a word is unknown.
_MORPHY_RULES = (
    ("s", ""),
    ("ses", "s"),
    ("xes", "x"),
    ("zes", "z"),
    ("ches", "ch"),
    ("shes", "sh"),
    ("men", "man"),
    ("ies", "y"),
)


class Resolves(Protocol):
    """What :class:`WordResolver` needs of a taxonomy."""

    def resolve(self, text: str, prefer: Callable[[str], float] | None = None) -> str: ...


class WordResolver:
    """``taxonomy.resolve`` with a fallback for plurals (``sneakers``, ``trousers``,
    ``running shoes``): the base forms WordNet's ``morphy`` would try -- its
    exception list ``noun.exc`` and its suffix rules -- on the last word."""

    def __init__(self, taxonomy: Resolves, wordnet_dir: str | os.PathLike | None = None) -> None:
        self.taxonomy = taxonomy
        self.wordnet_dir = wordnet_dir
        self._exceptions: dict[str, list[str]] | None = None

    def resolve(self, text: str, prefer: Callable[[str], float] | None = None) -> str:
        try:
            return self.taxonomy.resolve(text, prefer=prefer)
        except UnknownLabelError as first:
            for base in self.base_forms(text):
                try:
                    return self.taxonomy.resolve(base, prefer=prefer)
                except UnknownLabelError:
                    continue
            raise first from None

    def base_forms(self, text: str) -> list[str]:
        words = text.strip().replace("_", " ").split()
        if not words or len(text) > 200:
            return []
        last = words[-1].lower()
        cands = list(self._noun_exceptions().get(last, ()))
        for suffix, repl in _MORPHY_RULES:
            if last.endswith(suffix) and len(last) > len(suffix):
                cands.append(last[: -len(suffix)] + repl)
        head = " ".join(words[:-1])
        return [f"{head} {c}".strip() for c in dict.fromkeys(cands)]

    def _noun_exceptions(self) -> dict[str, list[str]]:
        if self._exceptions is None:
            exc: dict[str, list[str]] = {}
            path = Path(self.wordnet_dir, "noun.exc") if self.wordnet_dir is not None else None
            if path is not None and path.exists():
                for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                    parts = line.split()
                    if len(parts) >= 2:
                        exc[parts[0]] = parts[1:]
            self._exceptions = exc
        return self._exceptions
