"""The graph backend's parameters (:mod:`.graph`): their defaults and checks, the
defaults that depend on the dimension and the depth of the data, and the beam
widths the calibration of ``ef`` tries.

Parameters: ``R`` (32; 48 on deep data, :data:`DEEP_DEFAULTS`),
``ef_construction`` (:func:`construction_default`: 48 up to 20-d in the
ball, 128 above 40-d, else 96), ``alpha`` (1.0), ``ef``
(``None``: calibrated to ``target_recall`` (0.99, recall@10) on the data;
:func:`default_ef` of the dimension and depth before a calibration), ``n_entries`` (256),
``max_batch`` (4096), ``handoffs`` (3), ``mates`` (32), ``min_degree`` (8; 16
on deep data),
``precision`` ("auto"), ``build_threads`` (0: the CPUs),
``filter_exact_threshold`` (20000), ``seed`` (100).
"""

from __future__ import annotations

from typing import Any

from ..geometry import IndexSpace, PoincareIndexSpace

DEFAULTS: dict[str, Any] = {
    "R": 32,
    "ef_construction": 96,
    "alpha": 1.0,
    "ef": None,
    "max_batch": 4096,
    "build_threads": 0,
    "filter_exact_threshold": 20000,
    "seed": 100,
    "n_entries": 256,
    "handoffs": 3,
    "mates": 32,
    "min_degree": 8,
    "precision": "auto",
    "target_recall": 0.99,
}
#: ``precision="auto"``: float64 coordinates when more than this share of the
#: items is deep (label embeddings of a big taxonomy), else float32 with the
#: deep items scanned exactly.
AUTO_DEEP_SHARE = 0.01
#: the defaults that change when ``precision="auto"`` picks float64 for deep
#: data (unless given): on the WordNet noun embeddings (30,000 x 10-d) R = 48
#: and a minimum degree of 16 took recall@10 at ef 96 from 0.962 to 0.992 and
#: the build from 79 s to 12 s (a near-tree graph makes every beam long)
DEEP_DEFAULTS: dict[str, int] = {"R": 48, "min_degree": 16, "ef_construction": 96}
#: ``ef_construction`` by dimension (:func:`construction_default`): up to
#: ``NARROW_DIM`` in the ball :data:`NARROW_EF_CONSTRUCTION` (the 200,000 x
#: 16-d cloud: built in 7.3 s instead of 11.8 s, recall@10 0.9943 at ef 48
#: where 96 gave 0.9915 at ef 32 and 0.9966 at 48), above ``WIDE_DIM``
#: :data:`WIDE_EF_CONSTRUCTION` (the 64-d cloud: 96 built a graph that
#: needed a beam of 192-320 for 0.99, 128 one that needs 96-128: 8,700
#: queries/s instead of about 3,000, built in about the same time), 96
#: between, on products and on deep data (the noun embeddings lost recall
#: with 48: 0.986 at ef 512; :data:`DEEP_DEFAULTS`)
NARROW_DIM, WIDE_DIM = 20, 40
NARROW_EF_CONSTRUCTION, WIDE_EF_CONSTRUCTION = 48, 128
#: the graph's degree ``R`` above ``WIDE_DIM`` in the ball (:func:`degree_default`):
#: tuned on seed 1 of the 200,000 x 64-d cloud (benchmarks/tune_graph.py), where
#: R = 32 built a graph that reached recall@10 0.9832 at the widest calibrated
#: beam (512) and R = 48 one that reaches 0.9983 at ef 128 (calibrated: 64), the
#: build 85 s against 73 s (benchmarks/results/tune_graph-wide.md)
WIDE_R = 48
_INT_PARAMS = ("R", "ef_construction", "max_batch", "n_entries")
#: the beam widths the calibration tries, smallest first; none below 16: on a
#: 5,000-point cloud a width of 8 passed the calibration yet missed 4 of 50
#: exact-match queries for items added later in an empty region of the ball
EF_LADDER = (16, 20, 24, 32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
#: calibration: items of a bulk insertion searched as fresh queries and as near
#: copies (:meth:`GraphBackend._first_passing`), and the fewest nodes worth it
CALIBRATION_QUERIES = 500
CALIBRATION_MIN_NODES = 2000
#: the calibration asks this much more recall of its own queries than
#: ``target_recall``: on the 1,000,000-point cloud they passed at ef 48
#: where the benchmark's 1,000 fresh queries reached 0.9884 (0.9932 at 64);
#: checked on data the ANN benchmark does not measure (benchmarks/tune_graph.py,
#: seed 1, benchmarks/results/tune_graph.md): on the 200,000 x 16-d cloud no
#: margin calibrated ef 40 and reached 0.9868, 0.003 calibrated 48 and reached 0.9935
CALIBRATION_MARGIN = 0.003


def default_ef(dim: int, n: int, *, deep: bool = False, product: bool = False) -> int:
    """The beam width a search uses when neither the call nor the parameters set
    one (before a calibration: a graph under ``CALIBRATION_MIN_NODES`` items, or
    ``target_recall=0``), for ``n`` items of dimension ``dim`` (``deep``: ball
    data deep enough for float64 coordinates, such as label embeddings;
    ``product``: a product space): the narrowest width of :data:`EF_LADDER` that
    reached recall@10 >= 0.99 on data ``benchmarks/ann.py`` does not measure
    (``benchmarks/tune_graph.py``, seed 1: benchmarks/results/tune_graph.md,
    tune_graph-more.md, tune_graph-wide.md); a bigger graph needs a wider beam."""
    big = n > 300_000
    if product and n > 100_000:  # mixed curvature, 200,000: 0.9905 at 48
        return 48
    if deep:  # WordNet nouns, other queries: 0.9920 at 32 on 30,000; 0.9900 at 128 on 82,115
        return 32 if n <= 50_000 else 128
    if dim <= 20:  # 16-d cloud: 0.9935 at 48 on 200,000; 0.9912 at 64 on 1,000,000
        return 64 if big else 48
    if dim <= 40:  # the 32-d tree at 200,000 needed only 16; no 32-d cloud tuned yet
        return 96 if big else 64
    if big:  # not tuned: no cloud above 40-d with more than 300,000 points
        return 256
    return 64  # 64-d cloud, R 48, 200,000: 0.9931 at 64


def construction_default(dim: int, *, product: bool = False) -> int:
    """The ``ef_construction`` a graph of dimension ``dim`` builds with unless
    given (see :data:`NARROW_EF_CONSTRUCTION`; deep data: :data:`DEEP_DEFAULTS`)."""
    if dim > WIDE_DIM:
        return WIDE_EF_CONSTRUCTION
    if dim <= NARROW_DIM and not product:
        return NARROW_EF_CONSTRUCTION
    return DEFAULTS["ef_construction"]


def degree_default(dim: int, *, product: bool = False) -> int:
    """The degree ``R`` a graph of dimension ``dim`` builds with unless given
    (:data:`WIDE_R` above ``WIDE_DIM`` in the ball; deep data: :data:`DEEP_DEFAULTS`)."""
    if dim > WIDE_DIM and not product:
        return WIDE_R
    return DEFAULTS["R"]


def check_params(space: IndexSpace, params: dict[str, Any]) -> dict[str, Any]:
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"graph backend: unknown parameters {sorted(unknown)}")
    p = {**DEFAULTS, **params}
    for key in _INT_PARAMS + (() if p["ef"] is None else ("ef",)):
        if int(p[key]) < 1:
            raise ValueError(f"graph backend: {key} must be >= 1, got {p[key]!r}")
    if int(p["R"]) < 2:
        raise ValueError(f"graph backend: R must be >= 2, got {p['R']!r}")
    if not float(p["alpha"]) >= 1.0:
        raise ValueError(f"graph backend: alpha must be >= 1, got {p['alpha']!r}")
    if not 0.0 <= float(p["target_recall"]) <= 1.0:
        raise ValueError(
            f"graph backend: target_recall must be in [0, 1], got {p['target_recall']!r}"
        )
    for key in ("filter_exact_threshold", "build_threads", "handoffs", "mates", "min_degree"):
        if int(p[key]) < 0:
            raise ValueError(f"graph backend: {key} must be >= 0, got {p[key]!r}")
    if p["precision"] not in ("auto", "float32", "float64"):
        raise ValueError(
            "graph backend: precision must be 'auto', 'float32' or 'float64', "
            f"got {p['precision']!r}"
        )
    if not isinstance(space, PoincareIndexSpace) and p["precision"] == "float32":
        raise ValueError("graph backend: a product space is indexed in float64 only")
    return {
        k: (
            float(v)
            if k in ("alpha", "target_recall")
            else v
            if k == "precision" or v is None
            else int(v)
        )
        for k, v in p.items()
    }


def first_true(passes, lo: int, hi: int) -> int:
    """The first ``i`` in ``[lo, hi]`` with ``passes(i)`` (``hi`` if none does),
    for a ``passes`` that is monotone (recall grows with the beam width):
    galloping steps from ``lo`` (1, 2, 4, ...), then bisection.  A search's
    cost grows with its width, so the probes stay near the answer: the noun
    embeddings, calibrated to the last width of :data:`EF_LADDER`, took 19
    probes one by one and take 6."""
    if passes(lo):
        return lo
    fail, step = lo, 1
    while fail + step < hi:
        if passes(fail + step):
            hi = fail + step
            break
        fail += step
        step *= 2
    # passes(fail) is false; the answer is in (fail, hi]
    while hi - fail > 1:
        mid = (fail + hi) // 2
        if passes(mid):
            hi = mid
        else:
            fail = mid
    return hi
