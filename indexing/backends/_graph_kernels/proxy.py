"""The metric the graph kernels rank with, compiled: the Poincaré ranking proxy or an
exact product distance (:func:`metric`), its symmetric form between nodes, the
re-rank bound of float32 coordinates, and prefetching."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from models.geometry.kernels import dist as _exact_dist
from models.geometry.ranking import arcosh1p

_FLAGS_LIVE = 1


#: metric modes: the Poincaré ranking proxy (``aux[:, 0]`` = w) or an exact
#: product distance (``aux`` = the factors' gaps of models.geometry.kernels).
#: :func:`metric` makes the ``met`` tuple the kernels take; its *type* says the
#: mode (the ball's is the 1-tuple ``(MODE_BALL,)``), so every kernel is
#: compiled once per mode with the other mode's code absent: with one kernel
#: branching on the mode at run time, the product branch in the loop made
#: the ball's beam search twice as slow.
MODE_BALL, MODE_PRODUCT = 0, 1


def metric(ball: bool, table) -> tuple:
    """The ``met`` argument of the kernels: ``(MODE_BALL,)`` or
    ``(MODE_PRODUCT, kinds, starts, curvatures)``."""
    return (MODE_BALL,) if ball else (MODE_PRODUCT, *table)


def _is_ball(met) -> bool:
    """Typing time: is ``met`` the ball's tuple?"""
    return isinstance(met, types.BaseTuple) and len(met) == 1


def _key(x, aux, i, q, qa, met):
    """Ranking key of row ``i`` of ``x`` from the point ``q`` (row 0 of ``q``,
    its aux data ``qa``): the proxy ``|x_i - q|^2 w_i`` in the ball, the exact
    distance in a product.  (Compiled code only.)"""
    raise NotImplementedError


def _sym(x, aux, i, j, met):
    """Symmetric key between nodes: ``K(i, j) = |x_i - x_j|^2 w_i w_j`` in the
    ball, the exact distance in a product.  (Compiled code only.)"""
    raise NotImplementedError


def _to_sym(kk, aux, node, met):
    """The symmetric key of a pair from the key of ``node``'s point to the other.
    (Compiled code only.)"""
    raise NotImplementedError


def _arc(kk, two_c, met):
    """A monotone stand-in for the distance: ``sqrt(c) d = arcosh(1 + 2cK)`` in
    the ball, the distance itself in a product.  (Compiled code only.)"""
    raise NotImplementedError


@intrinsic
def _prefetch(typingctx, arr, i, j):
    """Ask the CPU to bring the cache line of ``arr[i, j]`` in (``llvm.prefetch``,
    read, high locality): a beam expansion reads the rows of ~16 random nodes,
    and issuing every row's loads before using any of them overlaps their
    cache misses (hnswlib's ``_mm_prefetch``).  (Compiled code only.)"""
    if not isinstance(arr, types.Array) or arr.ndim != 2:
        return None
    sig = types.void(arr, i, j)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [
            context.cast(builder, a, t, types.intp)
            for a, t in zip(args[1:], signature.args[1:], strict=True)
        ]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx, wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        flags = [ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)]
        builder.call(fn, [builder.bitcast(ptr, i8p), *flags])
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def _prefetch_row(a, i):
    """Prefetch every cache line of row ``i`` of the 2-d array ``a``."""
    step = max(1, 64 // a.itemsize)
    for t in range(0, a.shape[1], step):
        _prefetch(a, i, t)


_arcosh1p = njit(inline="always")(arcosh1p)
_FAST = {"fastmath": True}


def _sqdist(a, i, b, j):
    """``|a_i - b_j|^2`` from the coordinate differences, summed in the
    coordinates' dtype (float32 rows: float32 sums, within the re-rank bound of
    :func:`rerank_bound`), returned as float64.  (Compiled code only.)"""
    raise NotImplementedError


@overload(_sqdist, jit_options=_FAST, inline="always")
def _sqdist_impl(a, i, b, j):
    if a.dtype == types.float32:

        def f32(a, i, b, j):
            s = np.float32(0.0)
            for t in range(a.shape[1]):
                d = a[i, t] - b[j, t]
                s += d * d
            return np.float64(s)

        return f32

    def f64(a, i, b, j):
        s = 0.0
        for t in range(a.shape[1]):
            d = a[i, t] - b[j, t]
            s += d * d
        return s

    return f64


@overload(_key, jit_options=_FAST)
def _key_impl(x, aux, i, q, qa, met):
    if _is_ball(met):
        return lambda x, aux, i, q, qa, met: _sqdist(x, i, q, 0) * aux[i, 0]

    def product(x, aux, i, q, qa, met):
        return _exact_dist(x, i, aux, q, 0, qa, met[1], met[2], met[3])

    return product


@overload(_sym, jit_options=_FAST)
def _sym_impl(x, aux, i, j, met):
    if _is_ball(met):
        return lambda x, aux, i, j, met: _sqdist(x, i, x, j) * aux[i, 0] * aux[j, 0]

    def product(x, aux, i, j, met):
        return _exact_dist(x, i, aux, x, j, aux, met[1], met[2], met[3])

    return product


@overload(_to_sym)
def _to_sym_impl(kk, aux, node, met):
    if _is_ball(met):
        return lambda kk, aux, node, met: kk * aux[node, 0]
    return lambda kk, aux, node, met: kk


@overload(_arc)
def _arc_impl(kk, two_c, met):
    if _is_ball(met):
        return lambda kk, two_c, met: _arcosh1p(two_c * np.float64(kk))
    return lambda kk, two_c, met: kk


def _lower(kk, aux, node, qa, met, lb):
    """A lower bound of the exact float64 distance from the query (aux row
    ``qa``) to ``node``, from its ranking key ``kk``: ``lb = (eps_rel,
    eps_abs, c)`` bound the key's rounding (float32 coordinates: see
    :func:`rerank_bound`).  (Compiled code only.)"""
    raise NotImplementedError


@overload(_lower)
def _lower_impl(kk, aux, node, qa, met, lb):
    if _is_ball(met):

        def ball(kk, aux, node, qa, met, lb):
            eps_rel, eps_abs, c = lb
            w = aux[node, 0]
            e = max(0.0, np.sqrt(kk / w) * (1.0 - eps_rel) - eps_abs)
            return _arcosh1p(2.0 * c * e * e * w * qa[0, 0]) / np.sqrt(c) * (1.0 - 1e-9)

        return ball
    # a product's key is the exact distance itself (float64 coordinates)
    return lambda kk, aux, node, qa, met, lb: kk * (1.0 - 1e-12)


def rerank_bound(ball: bool, float32: bool, dim: int, c: float) -> tuple:
    """``lb`` of :func:`search_batch`: how far a ranking key may be from the
    exact one.  Float32 ball coordinates: every coordinate of a point and of
    the query is rounded by at most ``2^-24`` of itself, so their difference
    by ``2^-24 (|q| + |x|) <= 2^-23 / sqrt(c)`` in norm (``eps_abs``, doubled),
    and the float32 sum of ``dim`` squares by ``(dim + 2) 2^-24`` relative
    (``eps_rel``, doubled).  A product graph ranks with the exact distance
    (``(0, 0, 1)``).  Float64 ball graphs (deep data, where the weights of
    :func:`~models.geometry.ranking.fast_gap` are not exact enough): ``None``,
    every candidate is re-ranked."""
    if not ball:
        return (0.0, 0.0, 1.0)
    if not float32:
        return None
    return ((dim + 2) * 2.0**-23, 2.0**-22 / np.sqrt(c), float(c))
