"""The embedded default taxonomy: WordNet's clothing, footwear and bags, for Fashion-MNIST.

:func:`default_taxonomy` is what ``hypsearch demo`` trains its labels on (the
pipeline that builds the demo's artifacts is :mod:`service.demo`).
"""

from __future__ import annotations

import os

from ..images.datasets import FASHION_MNIST_CLASSES
from .graph import DEFAULT_WORDNET_DIR, Taxonomy

#: WordNet subtrees of the default taxonomy: everything worn (clothing and
#: footwear live under covering.n.02) and every container (bags), plus their
#: ancestors up to entity.n.01.
DEFAULT_ROOTS = ("covering.n.02", "container.n.01")


def default_taxonomy(wordnet_dir: str | os.PathLike = DEFAULT_WORDNET_DIR) -> Taxonomy:
    """The default taxonomy, with WordNet's words for name resolution."""
    full = Taxonomy.from_wordnet(wordnet_dir)
    keep: set[str] = set()
    for root in DEFAULT_ROOTS:
        keep.add(root)
        keep |= full.descendants(root)
        keep |= full.ancestors(root)
    for _, synset in FASHION_MNIST_CLASSES:
        keep.add(synset)
        keep |= full.ancestors(synset)
    return full.induced(keep)
