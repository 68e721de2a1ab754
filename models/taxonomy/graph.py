"""Label hierarchies (taxonomies): a DAG of string node names with integer ids.

A taxonomy is a directed acyclic graph of ``child -> parent`` edges; a node
may have several parents (WordNet has multiple inheritance).  Whatever form
the edges come in -- only the direct edges, the full transitive closure, or
anything in between -- they are reduced to the *transitive reduction* (the
direct "parent" edges), so every form of the same hierarchy loads to an equal
:class:`Taxonomy` with the same ids.

This module is the hierarchy itself (building, ancestors, descendants, LCA,
hops, siblings, cousins).  Beside it: :mod:`models.taxonomy.tsv` reads and
writes the ``child<TAB>parent`` files (a node with neither parent nor child
cannot be written in an edge list, so :meth:`Taxonomy.to_tsv` drops such
isolated nodes), :mod:`models.taxonomy.words` resolves words and completes
prefixes, :mod:`models.taxonomy.wordnet` reads WordNet and its morphology, and
:mod:`models.taxonomy.base` holds the errors.

Conventions
-----------
* Node ids are the positions of the names in ``sorted(names)``: the same
  hierarchy always gets the same ids whatever the file order or form.
* ``depth(n)`` is the length of the *shortest* upward path from ``n`` to a
  root; roots have depth 0.
* ``ancestors``/``descendants`` are proper (never contain the node itself) and
  follow all paths.
* Every query taking a node accepts its name or its integer id.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from pathlib import Path

import numpy as np

from models.taxonomy.base import EdgeError, TaxonomyError, UnknownLabelError, gc_paused, norm
from models.taxonomy.tsv import read_tsv, write_tsv
from models.taxonomy.wordnet import DEFAULT_WORDNET_DIR, load_wordnet_nouns
from models.taxonomy.words import WordIndex, word_of_name

__all__ = [
    "DEFAULT_WORDNET_DIR",
    "Taxonomy",
    "TaxonomyError",
    "UnknownLabelError",
    "with_words",
]

log = logging.getLogger(__name__)

_MAX_CYCLE_SHOWN = 8


class Taxonomy:
    """An immutable DAG over string node names with integer ids (``names[id]``).

    Build with :meth:`from_edges`, :meth:`from_tsv` or :meth:`from_wordnet`.
    The arrays and lists handed out are shared: do not mutate them.
    """

    __slots__ = (
        "_names",
        "_index",
        "_parents",
        "_children",
        "_anc_ptr",
        "_anc_idx",
        "_desc",
        "_depth",
        "_lemmas",
        "_glosses",
        "_word_index",
        "_words_src",
        "_hash",
    )

    # ------------------------------------------------------------------ build

    def __init__(self, *args, **kwargs):
        raise TypeError("build a Taxonomy with Taxonomy.from_edges, from_tsv or from_wordnet")

    @classmethod
    def from_edges(cls, edges: Iterable[tuple[str, str]], nodes: Iterable[str] = ()) -> Taxonomy:
        """Build from ``(child, parent)`` pairs (direct edges, closure, or a mix).

        *nodes* adds nodes (possibly isolated).  Duplicate edges are fine;
        self-loops and cycles raise :class:`TaxonomyError` naming an edge.
        """
        return cls._build(edges, nodes)

    @classmethod
    def _build(
        cls,
        edges: Iterable[tuple[str, str]],
        nodes: Iterable[str] = (),
        *,
        lemmas: dict[str, list[str]] | None = None,
        glosses: dict[str, str] | None = None,
        word_index: dict[str, list[str]] | None = None,
    ) -> Taxonomy:
        with gc_paused():
            return cls._build_impl(edges, nodes, lemmas, glosses, word_index)

    @classmethod
    def _build_impl(cls, edges, nodes, lemmas, glosses, word_index) -> Taxonomy:
        edge_list: list[tuple[str, str]] = []
        for e in edges:
            try:
                c, p = e
            except (TypeError, ValueError):
                raise TaxonomyError(f"an edge must be a (child, parent) pair, got {e!r}") from None
            if c == p:
                raise EdgeError(f"self-loop edge {c!r} -> {p!r}", (c, p))
            edge_list.append((c, p))
        name_set = {nodes} if isinstance(nodes, str) else set(nodes)
        name_set.update(chain.from_iterable(edge_list))
        for n in name_set:
            if not isinstance(n, str) or not n or n != n.strip() or "\t" in n or "\n" in n:
                raise TaxonomyError(
                    f"invalid node name {n!r} (need a non-empty string without tabs, "
                    "newlines or surrounding whitespace)"
                )
        names = sorted(name_set)
        index = {n: i for i, n in enumerate(names)}
        n_nodes = len(names)

        # candidate parents (any ancestor the input names) per node
        cand: list[set[int] | None] = [None] * n_nodes
        for c, p in edge_list:
            ci = index[c]
            s = cand[ci]
            if s is None:
                cand[ci] = {index[p]}
            else:
                s.add(index[p])

        # Kahn: parents before children; level = longest path from a root
        kids: list[list[int]] = [[] for _ in range(n_nodes)]
        missing = [0] * n_nodes
        for ci, s in enumerate(cand):
            if s:
                missing[ci] = len(s)
                for pi in s:
                    kids[pi].append(ci)
        level = [0] * n_nodes
        order = [i for i in range(n_nodes) if missing[i] == 0]
        k = 0
        while k < len(order):
            pi = order[k]
            k += 1
            lv = level[pi] + 1
            for ci in kids[pi]:
                if level[ci] < lv:
                    level[ci] = lv
                missing[ci] -= 1
                if missing[ci] == 0:
                    order.append(ci)
        del kids
        if len(order) < n_nodes:
            cls._raise_cycle(names, cand, missing, edge_list, index)

        # transitive reduction + ancestor sets, in topological order.  A
        # candidate parent is redundant iff it is an ancestor of another
        # candidate; scanning candidates deepest-first, it is then already
        # covered by the ancestors of a kept (deeper) candidate.
        anc: list[set[int]] = [set()] * n_nodes
        parents: list[tuple[int, ...]] = [()] * n_nodes
        for ci in order:
            s = cand[ci]
            if not s:
                continue
            if len(s) == 1:
                (pi,) = s
                a = set(anc[pi])
                a.add(pi)
                parents[ci] = (pi,)
            else:
                a = set()
                kept = []
                for pi in sorted(s, key=level.__getitem__, reverse=True):
                    if pi not in a:
                        kept.append(pi)
                        a |= anc[pi]
                a.update(kept)
                kept.sort()
                parents[ci] = tuple(kept)
            anc[ci] = a
            cand[ci] = None
        del cand, edge_list

        self = object.__new__(cls)
        self._names = names
        self._index = index
        self._parents = parents
        children: list[list[int]] = [[] for _ in range(n_nodes)]
        for ci in range(n_nodes):
            for pi in parents[ci]:
                children[pi].append(ci)  # ci ascending -> children sorted
        self._children = [tuple(c) for c in children]
        counts = np.fromiter((len(a) for a in anc), dtype=np.int64, count=n_nodes)
        ptr = np.zeros(n_nodes + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        idx = np.fromiter(
            chain.from_iterable(sorted(a) for a in anc), dtype=np.int32, count=int(ptr[-1])
        )
        del anc
        ptr.flags.writeable = False
        idx.flags.writeable = False
        self._anc_ptr = ptr
        self._anc_idx = idx
        self._desc = None

        depth = np.full(n_nodes, -1, dtype=np.int32)
        queue = deque(i for i in range(n_nodes) if not parents[i])
        for i in queue:
            depth[i] = 0
        while queue:
            pi = queue.popleft()
            d = depth[pi] + 1
            for ci in self._children[pi]:
                if depth[ci] < 0:
                    depth[ci] = d
                    queue.append(ci)
        depth.flags.writeable = False
        self._depth = depth

        self._lemmas = None if lemmas is None else {n: lemmas.get(n, []) for n in names}
        self._glosses = None if glosses is None else {n: glosses.get(n, "") for n in names}
        self._words_src = word_index
        self._word_index = None
        self._hash = None
        return self

    @staticmethod
    def _raise_cycle(names, cand, missing, edge_list, index):
        # Every node left over by Kahn has a left-over parent: walking up
        # through left-over parents must come back to a node already seen.
        start = min(i for i, m in enumerate(missing) if m > 0)
        seen: dict[int, int] = {}
        path: list[int] = []
        x = start
        while x not in seen:
            seen[x] = len(path)
            path.append(x)
            x = min(p for p in cand[x] if missing[p] > 0)
        cyc = path[seen[x] :] + [x]  # child -> parent -> ... -> back to start
        cyc_edges = {(names[a], names[b]) for a, b in zip(cyc, cyc[1:], strict=False)}
        # name the edge of the cycle that comes last in the input (the one that closed it)
        edge = max((i, e) for i, e in enumerate(edge_list) if e in cyc_edges)[1]
        # show the cycle starting at the named edge
        k = cyc.index(index[edge[0]])
        ring = cyc[k:-1] + cyc[:k] + [cyc[k]]
        shown = [names[i] for i in ring]
        if len(shown) > _MAX_CYCLE_SHOWN:
            shown = shown[: _MAX_CYCLE_SHOWN - 1] + ["...", shown[-1]]
        raise EdgeError(
            f"cycle at edge {edge[0]!r} -> {edge[1]!r} (child -> parent): " + " -> ".join(shown),
            edge,
        )

    @classmethod
    def from_tsv(cls, path: str | os.PathLike) -> Taxonomy:
        """Load a ``child<TAB>parent`` edge list (closure or direct edges).

        Errors name the file and line: a line without exactly two non-empty
        tab-separated fields, a self-loop, an edge that closes a cycle.
        """
        return read_tsv(path, cls._build)

    @classmethod
    def from_wordnet(
        cls, wordnet_dir: str | os.PathLike = DEFAULT_WORDNET_DIR, root: str | None = None
    ) -> Taxonomy:
        """The WordNet noun hierarchy (hypernyms and instance hypernyms).

        With *root* (a synset name such as ``"mammal.n.01"``) only ``root`` and
        its descendants are kept, with the edges among them.  Node words
        (``lemmas``), glosses and the WordNet sense order come along for
        :meth:`resolve` and :meth:`complete`.
        """
        wn = load_wordnet_nouns(wordnet_dir)
        if root is None:
            keep: Iterable[str] = wn.names
            keep_set = None
        else:
            if root not in wn.lemmas:
                sugg = list(wn.word_index.get(norm(root), ()))[:5]
                for m in difflib.get_close_matches(root, wn.names, n=5, cutoff=0.7):
                    if m not in sugg:
                        sugg.append(m)
                raise UnknownLabelError(root, sugg[:8], what="WordNet noun synset")
            children: dict[str, list[str]] = {}
            for c, ps in wn.parents.items():
                for p in ps:
                    children.setdefault(p, []).append(c)
            keep_set = {root}
            stack = [root]
            while stack:
                for c in children.get(stack.pop(), ()):
                    if c not in keep_set:
                        keep_set.add(c)
                        stack.append(c)
            keep = [n for n in wn.names if n in keep_set]
        edges = ((c, p) for c in keep for p in wn.parents[c] if keep_set is None or p in keep_set)
        return cls._build(edges, keep, lemmas=wn.lemmas, glosses=wn.gloss, word_index=wn.word_index)

    def subtree(self, root: str | int) -> Taxonomy:
        """*root* and all its descendants, with the edges among them (metadata kept)."""
        r = self._id(root)
        return self.induced([r, *self._desc_row(r).tolist()])

    def induced(self, nodes: Iterable[str | int]) -> Taxonomy:
        """The sub-hierarchy on *nodes*: those nodes and the direct edges among them.

        Metadata (words, glosses) is kept.

        Include the ancestors of the nodes you keep, or their chains to a root
        break (a kept node whose parents are all dropped becomes a root).
        """
        keep = sorted({self._id(x) for x in nodes})
        names = self._names
        keep_set = set(keep)
        edges = [(names[c], names[p]) for c in keep for p in self._parents[c] if p in keep_set]
        return type(self)._build(
            edges,
            (names[i] for i in keep),
            lemmas=self._lemmas,
            glosses=self._glosses,
            word_index=self._word_table().table if self._lemmas is not None else None,
        )

    def to_tsv(self, path: str | os.PathLike, closure: bool = True) -> None:
        """Write ``child<TAB>parent`` lines atomically (temp file + ``os.replace``).

        ``closure=True`` writes every (descendant, ancestor) pair, else only the
        direct edges.  Both load back to an equal taxonomy; isolated nodes
        (no parent, no child) cannot be written and are dropped.
        """
        if closure:
            ptr = self._anc_ptr.tolist()
            flat = self._anc_idx.tolist()
            rows = (flat[ptr[i] : ptr[i + 1]] for i in range(len(self._names)))
        else:
            rows = iter(self._parents)
        write_tsv(path, self._names, rows, closure=closure)

    # ------------------------------------------------------------ basic info

    @property
    def names(self) -> list[str]:
        """Node names; ``names[i]`` is the node with id ``i`` (sorted order)."""
        return self._names

    @property
    def lemmas(self) -> dict[str, list[str]] | None:
        """Synset -> its WordNet lemma words (taxonomies from WordNet), else ``None``."""
        return self._lemmas

    @property
    def glosses(self) -> dict[str, str] | None:
        """Synset -> WordNet definition (taxonomies from WordNet), else ``None``."""
        return self._glosses

    @property
    def depths(self) -> np.ndarray:
        """Read-only int32 array: ``depths[i] == depth(i)``."""
        return self._depth

    @property
    def max_depth(self) -> int:
        return int(self._depth.max()) if len(self._names) else 0

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __repr__(self) -> str:
        return (
            f"Taxonomy({len(self)} nodes, {sum(map(len, self._parents))} direct edges, "
            f"{len(self._anc_idx)} closure edges, max_depth={self.max_depth})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Taxonomy):
            return NotImplemented
        return self._names == other._names and self._parents == other._parents

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((tuple(self._names), tuple(self._parents)))
        return self._hash

    def index(self, name: str) -> int:
        """Id of node *name* (raises :class:`UnknownLabelError`)."""
        try:
            return self._index[name]
        except (KeyError, TypeError):
            raise UnknownLabelError(str(name), self.suggest(str(name))) from None

    def _id(self, node: str | int) -> int:
        if isinstance(node, str):
            return self.index(node)
        if isinstance(node, (int, np.integer)) and not isinstance(node, bool):
            i = int(node)
            if 0 <= i < len(self._names):
                return i
            raise UnknownLabelError(str(node)) from None
        raise TypeError(f"node must be a name or an id, got {type(node).__name__}")

    # --------------------------------------------------------- graph queries

    def roots(self) -> list[str]:
        """Nodes without parents (sorted)."""
        return [n for n, p in zip(self._names, self._parents, strict=True) if not p]

    def leaves(self) -> list[str]:
        """Nodes without children (sorted)."""
        return [n for n, c in zip(self._names, self._children, strict=True) if not c]

    def parents(self, name: str | int) -> list[str]:
        """Direct parents (after transitive reduction), sorted."""
        return [self._names[i] for i in self._parents[self._id(name)]]

    def children(self, name: str | int) -> list[str]:
        """Direct children, sorted."""
        return [self._names[i] for i in self._children[self._id(name)]]

    def parent_ids(self, node: str | int) -> tuple[int, ...]:
        return self._parents[self._id(node)]

    def child_ids(self, node: str | int) -> tuple[int, ...]:
        return self._children[self._id(node)]

    def _anc_row(self, i: int) -> np.ndarray:
        return self._anc_idx[self._anc_ptr[i] : self._anc_ptr[i + 1]]

    def _desc_row(self, i: int) -> np.ndarray:
        if self._desc is None:
            counts = np.diff(self._anc_ptr)
            rows = np.repeat(np.arange(len(self._names), dtype=np.int32), counts)
            order = np.argsort(self._anc_idx, kind="stable")
            idx = rows[order]
            ptr = np.zeros(len(self._names) + 1, dtype=np.int64)
            np.cumsum(np.bincount(self._anc_idx, minlength=len(self._names)), out=ptr[1:])
            ptr.flags.writeable = False
            idx.flags.writeable = False
            self._desc = (ptr, idx)
        ptr, idx = self._desc
        return idx[ptr[i] : ptr[i + 1]]

    def ancestor_ids(self, node: str | int) -> np.ndarray:
        """Sorted ids of the proper ancestors (read-only array)."""
        return self._anc_row(self._id(node))

    def descendant_ids(self, node: str | int) -> np.ndarray:
        """Sorted ids of the proper descendants (read-only array)."""
        return self._desc_row(self._id(node))

    def ancestors(self, name: str | int) -> set[str]:
        """Proper ancestors along all paths."""
        names = self._names
        return {names[i] for i in self._anc_row(self._id(name)).tolist()}

    def descendants(self, name: str | int) -> set[str]:
        """Proper descendants along all paths."""
        names = self._names
        return {names[i] for i in self._desc_row(self._id(name)).tolist()}

    def is_ancestor(self, ancestor: str | int, node: str | int) -> bool:
        """True when *ancestor* is a proper ancestor of *node*."""
        a = self._id(ancestor)
        row = self._anc_row(self._id(node))
        k = int(np.searchsorted(row, a))
        return k < len(row) and int(row[k]) == a

    def depth(self, name: str | int) -> int:
        """Length of the shortest upward path to a root (roots: 0)."""
        return int(self._depth[self._id(name)])

    def _up_dists(self, i: int) -> dict[int, int]:
        dist = {i: 0}
        queue = deque((i,))
        while queue:
            x = queue.popleft()
            d = dist[x] + 1
            for p in self._parents[x]:
                if p not in dist:
                    dist[p] = d
                    queue.append(p)
        return dist

    def lca(self, a: str | int, b: str | int) -> str | None:
        """Deepest common ancestor-or-self of *a* and *b*.

        Deepest = largest :meth:`depth`; ties go to the smallest id (name
        order).  ``None`` when *a* and *b* share no ancestor (different roots).
        """
        i, j = self._id(a), self._id(b)
        common = set(self._anc_row(i).tolist())
        common.add(i)
        other = set(self._anc_row(j).tolist())
        other.add(j)
        common &= other
        if not common:
            return None
        depth = self._depth
        best = max(common, key=lambda m: (int(depth[m]), -m))
        return self._names[best]

    def hops(self, a: str | int, b: str | int) -> int | None:
        """Shortest path length between *a* and *b* through a common ancestor-or-self.

        ``min over m of dist(a, m) + dist(b, m)`` with ``dist`` the shortest
        upward path over direct edges; 0 for ``a == b``, 1 for a parent.
        ``None`` when no common ancestor exists.
        """
        da = self._up_dists(self._id(a))
        db = self._up_dists(self._id(b))
        if len(db) < len(da):
            da, db = db, da
        best = None
        for m, d in da.items():
            e = db.get(m)
            if e is not None and (best is None or d + e < best):
                best = d + e
        return best

    def hop_table(self, nodes: list[str], missing: int) -> np.ndarray:
        """(K, K) int64 :meth:`hops` between ``nodes``; ``missing`` where two have no
        common ancestor."""
        n = len(nodes)
        table = np.zeros((n, n), dtype=np.int64)
        for i in range(n):
            for j in range(i + 1, n):
                h = self.hops(nodes[i], nodes[j])
                table[i, j] = table[j, i] = missing if h is None else h
        return table

    def siblings(self, name: str | int) -> set[str]:
        """Nodes sharing at least one parent with *name*, not itself."""
        i = self._id(name)
        out = {c for p in self._parents[i] for c in self._children[p]}
        out.discard(i)
        return {self._names[c] for c in out}

    def cousins(self, name: str | int) -> set[str]:
        """Nodes sharing a grandparent with *name* but no parent.

        Itself and its own ancestors/descendants are never cousins (in a DAG a
        node's parent can be another grandparent's grandchild).
        """
        i = self._id(name)
        par = self._parents[i]
        grand = {g for p in par for g in self._parents[p]}
        out = {c for g in grand for q in self._children[g] for c in self._children[q]}
        out.difference_update(c for p in par for c in self._children[p])  # siblings + self
        out.discard(i)
        if out:
            out.difference_update(self._anc_row(i).tolist())
            out.difference_update(self._desc_row(i).tolist())
        return {self._names[c] for c in out}

    def closure_edges(self) -> np.ndarray:
        """int64 array (E, 2) of (descendant_id, ancestor_id) pairs, no self pairs.

        Sorted by descendant id, then ancestor id.
        """
        counts = np.diff(self._anc_ptr)
        out = np.empty((len(self._anc_idx), 2), dtype=np.int64)
        out[:, 0] = np.repeat(np.arange(len(self._names), dtype=np.int64), counts)
        out[:, 1] = self._anc_idx
        return out

    def direct_edges(self) -> np.ndarray:
        """int64 array (E, 2) of (child_id, parent_id) pairs, sorted."""
        flat = [(c, p) for c, ps in enumerate(self._parents) for p in ps]
        return np.array(flat, dtype=np.int64).reshape(-1, 2)

    # ------------------------------------------------------ words & labels

    def _word_table(self) -> WordIndex:
        """The words of the nodes (WordNet's index, else the node names' words)."""
        # Lazily built; safe under concurrent first calls: _word_index is set
        # before _words_src is dropped, and re-read after reading _words_src.
        table = self._word_index
        if table is None:
            src = self._words_src
            table = self._word_index
            if table is None:
                table = WordIndex(self._names, self._index, self._lemmas, src)
                self._word_index = table
                self._words_src = None  # folded into _word_index
        return table

    def words(self, name: str | int) -> list[str]:
        """Words that name the node: WordNet lemmas as written in the file
        (``['gym_shoe', 'sneaker', 'tennis_shoe']``), else the word derived
        from the node name (``gym_shoe.n.01`` -> ``gym_shoe``; ``sneakers`` ->
        ``sneakers``)."""
        n = self._names[self._id(name)]
        if self._lemmas is not None and self._lemmas.get(n):
            return list(self._lemmas[n])
        return [word_of_name(n)[0]]

    def senses(self, word: str) -> list[str]:
        """Nodes carrying *word* (any case, spaces or ``_``), in WordNet sense order."""
        return self._word_table().senses(word)

    def resolve(self, text: str, prefer: Callable[[str], float] | None = None) -> str:
        """Node name for *text*: an exact node name, else a word or phrase.

        A word ("Sneaker", "running shoe"; any case, spaces or ``_``) resolves
        among the nodes carrying it; with several, the one with the highest
        ``prefer(name)`` wins, ties (and ``prefer=None``) going to the earliest
        WordNet sense.  Raises :class:`UnknownLabelError` with suggestions.
        Plurals: :class:`models.taxonomy.wordnet.WordResolver`.
        """
        if not isinstance(text, str):
            raise TypeError(f"label must be a string, got {type(text).__name__}")
        if text.strip() in self._index:
            return text.strip()
        return self._word_table().resolve(text, prefer)

    def complete(self, prefix: str, limit: int = 20) -> list[str]:
        """Node names and words starting with *prefix* (any case, spaces or ``_``).

        Words come as lookup keys (lowercase, ``_`` for spaces).  Order:
        shorter first, then more common (more senses in this taxonomy), then
        alphabetical.
        """
        if limit <= 0:
            return []
        return self._word_table().complete(prefix, limit)

    def suggest(self, text: str, n: int = 5) -> list[str]:
        """Close matches for *text* among node names and words (difflib), best first."""
        return self._word_table().suggest(text, n)


def with_words(taxonomy: Taxonomy, wordnet_dir: str | os.PathLike | None) -> Taxonomy:
    """The taxonomy with WordNet's words and glosses (checkpoints keep only the
    edges), when every node is a WordNet noun synset and the edges are WordNet's
    among them; else the taxonomy as is."""
    if (
        taxonomy.lemmas is not None
        or wordnet_dir is None
        or not Path(wordnet_dir, "data.noun").exists()
    ):
        return taxonomy
    try:
        full = Taxonomy.from_wordnet(wordnet_dir)
        if not all(n in full for n in taxonomy.names):
            return taxonomy
        words = full.induced(taxonomy.names)
    except Exception:  # noqa: BLE001 - words are a convenience; synset names still work
        log.warning("could not read WordNet words from %s", wordnet_dir, exc_info=True)
        return taxonomy
    return words if words == taxonomy else taxonomy
