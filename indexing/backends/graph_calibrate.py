"""The calibration of the graph backend's default beam width (:mod:`.graph`): the
narrowest width of :data:`~.graph_params.EF_LADDER` whose recall reaches the target
on the items of a bulk insertion, as fresh queries and as near copies."""

from __future__ import annotations

import numpy as np

from ..table import ItemTable
from .graph_params import CALIBRATION_MARGIN, EF_LADDER, first_true


class CalibrationMixin:
    """:meth:`_first_passing` of :class:`~.graph.GraphBackend`."""

    def _first_passing(
        self, table: ItemTable, qs: np.ndarray, *, copies: bool, start: int = 0, k: int = 10
    ) -> int:
        """Calibration of the default beam width: the position in
        :data:`EF_LADDER` (from ``start``) of the first width whose recall@``k``
        for the items ``qs`` (slots) reaches ``target_recall`` (plus
        :data:`CALIBRATION_MARGIN`) against the exact
        brute-force truth (the last position if none does).

        ``ef=None`` searches use the width both kinds of query pass with (the
        larger of the two positions), each measured on
        :data:`CALIBRATION_QUERIES` items of a bulk insertion:

        * *fresh queries* (``copies=False``): the items, kept out until the
          graph of the others is built, search that graph -- as a query
          the graph has never seen does;
        * *near copies* (``copies=True``): the same items once in the graph,
          each asking for ``k + 1`` with itself left out -- a query next to
          an indexed item (query by example).

        Neither alone predicted the recall of the benchmark's own fresh
        queries on every dataset (near copies were too optimistic on the 16-d
        cloud and the mixed-curvature cloud; fresh queries on the WordNet noun
        embeddings, whose benchmark queries are nouns moved by a small step).
        Easy data get a narrow beam (ef 8 on the preferential-attachment cloud,
        where the table per dimension, :func:`default_ef`, gave 64) and hard
        data a wide one.  ``target_recall=0`` keeps the table.  (Called under
        the index's write lock.)"""
        from . import _graph_kernels as K

        nodes = np.nonzero(self._flags[: self._n] == 1)[0]
        slots = np.sort(self._n2s[nodes])
        q64 = np.ascontiguousarray(table.vectors[qs])
        gq = self.space.kernel_gaps(q64)
        kk = k + 1 if copies else k
        truth = np.empty((len(qs), kk), dtype=np.int64)

        def brute(a: int, b: int) -> None:
            K.brute_topk(
                q64[a:b], gq[a:b], table.vectors, self._g, slots, *self._table, kk, truth[a:b]
            )

        self._spread(len(qs), brute, min_chunk=8)
        want = [set(r[r != q].tolist()[:k]) for r, q in zip(truth, qs, strict=True)]
        if not copies:  # mid-insertion: entries from the graph as it is (repair
            # and the final entries come after; a copy query keeps those)
            self._pick_entries()
        # a margin over the target: 500 queries are one draw of the hard ones
        target = min(1.0, self._p["target_recall"] + CALIBRATION_MARGIN) * k * len(qs)

        def passes(i: int) -> bool:
            found, _ = self._graph_search(table, q64, kk, len(slots), None, EF_LADDER[i])
            hits = sum(
                len(w & set(r[r != q].tolist()[:k]))
                for w, r, q in zip(want, found, qs, strict=True)
            )
            return hits >= target

        return first_true(passes, start, len(EF_LADDER) - 1)
