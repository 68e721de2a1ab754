"""The index's view of a space: validation, exact distances, ranking proxies.

Every formula comes from :mod:`models.geometry`; this module adapts numpy
arrays to it.  The arithmetic the index ranks with -- ball membership, the
plain gap, the *deep* test (:data:`DEEP_GAP`), the ranking proxy and its
correction to a distance -- is :mod:`models.geometry.ranking` (numpy, no
torch); the exact float64 distances are ``models.geometry.poincare`` and
``models.geometry.product``, imported lazily (with torch) on the first exact
distance, so a process that only writes to a store starts fast.

* the ranking proxy selects candidates (float32 rows of a graph's or HNSW's
  candidates: :meth:`IndexSpace.proxy_rows`); they are re-ranked in float64 by the
  exact distance (the exact backend scans in float64, compiled);
* the HNSW and graph backends keep deep items out of a float32 graph and scan
  them in float64;
* :meth:`PoincareIndexSpace.euclidean_ball` (where the HNSW backend aims its
  Euclidean graph search) calls ``models.geometry.poincare.euclidean_ball``.

The classes here are *index* spaces (:class:`IndexSpace`,
:class:`PoincareIndexSpace`, :class:`ProductIndexSpace`,
:func:`make_index_space`); the embedding spaces of training are
``models.vision.heads.Space`` and ``models.geometry.ProductSpace``.
"""

from __future__ import annotations

import math
import re
import threading
from abc import ABC, abstractmethod
from contextlib import contextmanager
from functools import partial

import numpy as np

from models.geometry import ranking
from models.geometry.ranking import DEEP_GAP

from .errors import IndexInputError

__all__ = [
    "IndexSpace",
    "PoincareIndexSpace",
    "ProductIndexSpace",
    "make_index_space",
    "fmt_float",
    "torch_threads",
    "TORCH_THREADS",
    "DEEP_GAP",
]

#: torch intra-op threads while the index computes distances (``None``: leave
#: torch alone).  The index's tensors are small (a few thousand rows): torch's
#: thread pool costs more than it gains there, and next to other busy threads
#: it can cost much more.  The index's parallelism is its concurrent searches.
TORCH_THREADS: int | None = 1

_threads_lock = threading.Lock()
_threads_users = 0
_threads_saved = 0


def _torch():
    import torch

    return torch


@contextmanager
def torch_threads():
    """Run torch with :data:`TORCH_THREADS` intra-op threads; the previous
    setting comes back when the last concurrent user leaves."""
    global _threads_users, _threads_saved
    want = TORCH_THREADS
    if want is None:
        yield
        return
    torch = _torch()
    with _threads_lock:
        if _threads_users == 0:
            _threads_saved = torch.get_num_threads()
            if _threads_saved != want:
                torch.set_num_threads(want)
        _threads_users += 1
    try:
        yield
    finally:
        with _threads_lock:
            _threads_users -= 1
            if _threads_users == 0 and _threads_saved != want:
                torch.set_num_threads(_threads_saved)


def _poincare():
    from models.geometry import poincare

    return poincare


def _product():
    from models.geometry import product

    return product


def _on_torch(fn, q: np.ndarray, x: np.ndarray, *, rows: bool = False, dtype=np.float64):
    """``fn(q, x)`` on torch tensors of ``dtype`` (``q`` as ``(n, 1, d)`` when
    ``rows``: one query against its own rows of ``x``), back to numpy."""
    torch = _torch()
    tq = torch.from_numpy(np.ascontiguousarray(q, dtype=dtype))
    tx = torch.from_numpy(np.ascontiguousarray(x, dtype=dtype))
    with torch_threads():
        return fn(tq[:, None, :] if rows else tq, tx).numpy()


def _first_outside(a: np.ndarray, c: float) -> int | None:
    """The first row of ``a`` outside the ball of curvature ``c``, or ``None``."""
    outside = ~ranking.inside_ball(a, c)
    return int(np.nonzero(outside)[0][0]) if outside.any() else None


def fmt_float(x: float) -> str:
    """Short but unambiguous float text for messages (``1.0000002``, ``1.0``)."""
    s = f"{float(x):.9g}"
    if not any(ch in s for ch in ".eni"):
        s += ".0"
    return s


class IndexSpace(ABC):
    """What an index needs to know about its space."""

    kind: str
    dim: int

    @property
    @abstractmethod
    def spec(self) -> str:
        """The space string stored in the index's meta data."""

    # -- inputs ---------------------------------------------------------------
    def as_points(self, arr, name: str, *, allow_1d: bool = False) -> np.ndarray:
        """``arr`` as a C-contiguous float64 ``(n, dim)`` array of points, or
        :class:`IndexInputError` naming ``name`` and the first bad row."""
        try:
            a = np.asarray(arr, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise IndexInputError(f"{name}: not a numeric array ({exc})") from None
        if a.ndim == 1 and allow_1d:
            a = a[None, :]
        if a.ndim != 2 or a.shape[1] != self.dim:
            raise IndexInputError(
                f"{name}: expected an array of shape (n, {self.dim}), got shape {tuple(a.shape)}"
            )
        finite = np.isfinite(a)
        if not finite.all():
            i = int(np.nonzero(~finite.all(axis=1))[0][0])
            what = "NaN" if np.isnan(a[i]).any() else "an infinite value"
            raise IndexInputError(f"{name}[{i}]: contains {what}")
        self._check_members(a, name)
        return np.ascontiguousarray(a)

    @abstractmethod
    def _check_members(self, a: np.ndarray, name: str) -> None: ...

    # -- exact distances (float64, models.geometry) -----------------------------
    def dist_rows(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Exact float64 distances ``d(q[i], x[i, j])``:
        q ``(n, d)``, x ``(n, m, d)`` -> ``(n, m)``.

        Every distance an index returns comes from here or from the same
        compiled formula inside the graph kernel, so all backends agree bit
        for bit: :func:`models.geometry.kernels.dist` (the float64 twin of
        ``poincare.dist`` / ``ProductSpace.dist``, tested against them and
        against the 60-digit reference, boundary included), on the gaps of
        :func:`models.geometry.kernels.gaps`."""
        from models.geometry import kernels

        q = np.ascontiguousarray(q, dtype=np.float64).reshape(-1, self.dim)
        x = np.asarray(x, dtype=np.float64)
        n, m = x.shape[0], x.shape[1]
        flat = np.ascontiguousarray(x.reshape(n * m, self.dim))
        table = self.kernel_table()
        out = np.empty((n, m), dtype=np.float64)
        if out.size:
            rows = np.arange(n * m, dtype=np.int64).reshape(n, m)
            g = kernels.gaps(flat, table)
            kernels.dist_rows(q, kernels.gaps(q, table), flat, g, rows, *table, out)
        return out

    @abstractmethod
    def pairwise(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Exact float64 distance matrix ``(n, d), (m, d) -> (n, m)``."""

    # -- ranking proxy (float32) --------------------------------------------
    @abstractmethod
    def proxy_prepare(self, x: np.ndarray):
        """Per-item data for :meth:`proxy_rows` from float64 items ``(m, d)``."""

    @abstractmethod
    def proxy_rows(self, q: np.ndarray, rows) -> np.ndarray:
        """float32 keys ``(n, m)`` of gathered prepared data (arrays ``(n, m, ...)``)."""

    @abstractmethod
    def deep(self, x: np.ndarray) -> np.ndarray:
        """Boolean mask of the rows too close to the boundary for float32 ranking."""

    def proxy_take(self, prepared, rows: np.ndarray):
        """The prepared data of a subset of items."""
        return tuple(p[rows] for p in prepared)

    # -- compiled exact distances (models.geometry.kernels) -------------------
    @property
    @abstractmethod
    def factors(self) -> tuple[tuple[str, int, float], ...]:
        """``(kind, dim, curvature)`` of every factor (the ball: one factor)."""

    def kernel_table(self):
        """The factor table of :func:`models.geometry.kernels.factor_table` (made once:
        a space does not change)."""
        table = self.__dict__.get("_kernel_table")
        if table is None:
            from models.geometry import kernels

            table = self.__dict__["_kernel_table"] = kernels.factor_table(self.factors)
        return table

    def kernel_gaps(self, x: np.ndarray) -> np.ndarray:
        """Per-factor gaps ``(n, F)`` of :func:`models.geometry.kernels.gaps`."""
        from models.geometry import kernels

        return kernels.gaps(x, self.kernel_table())


class PoincareIndexSpace(IndexSpace):
    """The Poincaré ball of dimension ``dim`` and curvature ``-c`` (``c > 0``)."""

    kind = "poincare"

    def __init__(self, dim: int, curvature: float = 1.0) -> None:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise IndexInputError(f"dim: must be an integer >= 1, got {dim!r}")
        try:
            c = float(curvature)
        except (TypeError, ValueError):
            raise IndexInputError(
                f"curvature: must be a positive number, got {curvature!r}"
            ) from None
        if not (math.isfinite(c) and c > 0):
            raise IndexInputError(f"curvature: must be a positive number, got {curvature!r}")
        self.dim = int(dim)
        self.c = c

    @property
    def spec(self) -> str:
        return f"poincare:{self.dim}"

    @property
    def factors(self) -> tuple[tuple[str, int, float], ...]:
        return (("poincare", self.dim, self.c),)

    @property
    def radius(self) -> float:
        return 1.0 / math.sqrt(self.c)

    def _check_members(self, a: np.ndarray, name: str) -> None:
        i = _first_outside(a, self.c)
        if i is not None:
            raise IndexInputError(
                f"{name}[{i}]: norm {fmt_float(math.sqrt(ranking.sqnorm(a[i])))} is outside "
                f"the ball of curvature {fmt_float(self.c)} (must be < {fmt_float(self.radius)})"
            )

    def pairwise(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        return _on_torch(partial(_poincare().pairwise_dist, c=self.c), q, x)

    # ranking proxy (models.geometry.ranking): key(q, x) = |x - q|^2 w(x)
    def proxy_weight(self, x: np.ndarray) -> np.ndarray:
        """``w(x) = 1 / (1 - c|x|^2)`` in float64 (the proxy's per-item factor)."""
        return ranking.proxy_weight(x, self.c)

    def deep(self, x: np.ndarray) -> np.ndarray:
        return ranking.is_deep(x, self.c)

    def proxy_prepare(self, x: np.ndarray):
        # w from the float64 coordinates, stored as float32
        x = np.asarray(x, dtype=np.float64)
        return (x.astype(np.float32), self.proxy_weight(x).astype(np.float32))

    def proxy_rows(self, q: np.ndarray, rows) -> np.ndarray:
        x32, w = rows  # (n, m, d), (n, m)
        return ranking.proxy_key_rows(q, x32, w)

    def radius_from_key(self, q: np.ndarray, key: np.ndarray) -> np.ndarray:
        """Approximate geodesic distance from a proxy key (inf stays inf)."""
        torch = _torch()
        z = ranking.key_to_arg(key, np.asarray(q, dtype=np.float64), self.c)
        fin = np.isfinite(z)
        out = np.full(z.shape, np.inf)
        with torch_threads():
            out[fin] = _poincare().dist_from_arg(torch.from_numpy(z[fin]), c=self.c).numpy()
        return out

    def euclidean_ball(self, q: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Euclidean centres ``(n, d)`` and radii ``(n,)`` of the hyperbolic balls
        ``B(q[i], r[i])``.  Infinite radii give ``(q[i], inf)``."""
        torch = _torch()
        q = np.asarray(q, dtype=np.float64)
        r = np.asarray(r, dtype=np.float64)
        with torch_threads():
            centres, radii = _poincare().euclidean_ball(
                torch.from_numpy(q), torch.from_numpy(r), c=self.c
            )
        return centres.numpy(), radii.numpy()


class ProductIndexSpace(IndexSpace):
    """A product of constant-curvature factors (``models.geometry.product``);
    distance ``sqrt(sum_i d_i^2)``."""

    kind = "product"

    def __init__(self, spec: str) -> None:
        try:
            self.ps = _product().ProductSpace.parse(spec)
        except IndexInputError:
            raise
        except Exception as exc:  # noqa: BLE001 - any parse failure is an input error
            raise IndexInputError(f"space: cannot parse {spec!r} ({exc})") from None
        self.dim = int(self.ps.dim)
        self._spec = str(self.ps)

    @property
    def spec(self) -> str:
        return self._spec

    @property
    def factors(self) -> tuple[tuple[str, int, float], ...]:
        return tuple((f.kind, int(f.dim), float(f.curvature)) for f in self.ps.factors)

    def _ball_parts(self, a: np.ndarray):
        """``(start, factor, coordinates)`` of every Poincaré factor of the rows ``a``."""
        start = 0
        for f in self.ps.factors:
            if f.kind == "poincare":
                yield start, f, a[:, start : start + f.dim]
            start += f.dim

    def _check_members(self, a: np.ndarray, name: str) -> None:
        for start, f, part in self._ball_parts(a):
            i = _first_outside(part, f.curvature)
            if i is not None:
                raise IndexInputError(
                    f"{name}[{i}]: coordinates {start}:{start + f.dim} (factor {f}) have norm "
                    f"{fmt_float(math.sqrt(ranking.sqnorm(part[i])))}, outside the ball of "
                    f"curvature {fmt_float(f.curvature)} "
                    f"(must be < {fmt_float(1 / math.sqrt(f.curvature))})"
                )

    def pairwise(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        return _on_torch(self.ps.pairwise_dist, q, x)

    # ranking proxy: there is no per-factor monotone shortcut for
    # sqrt(sum d_i^2), so the proxy is the product distance itself, in float32,
    # through models.geometry.
    def proxy_prepare(self, x: np.ndarray):
        return (np.asarray(x, dtype=np.float32),)

    def deep(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        out = np.zeros(len(x), dtype=bool)
        for _, f, part in self._ball_parts(x):
            out |= ranking.is_deep(part, f.curvature)
        return out

    def proxy_rows(self, q: np.ndarray, rows) -> np.ndarray:
        (x32,) = rows
        d = _on_torch(self.ps.dist, q, x32, rows=True, dtype=np.float32)
        return np.nan_to_num(d.astype(np.float32, copy=False), nan=np.inf)


_POINCARE = re.compile(r"\s*poincare\s*:\s*([0-9]+)\s*(?:@\s*([^\s,]+)\s*)?")


def make_index_space(dim, curvature: float = 1.0, space: str | None = None) -> IndexSpace:
    """The index space for ``HyperbolicIndex(dim, curvature, space=...)``.

    ``None`` or ``"poincare:D"`` (optionally ``"poincare:D@c"``, then ``c``
    overrides a default ``curvature`` of 1 and must agree with any other) give
    the Poincaré ball; anything else is parsed by ``ProductSpace.parse``.
    """
    if space is not None and not isinstance(space, str):
        raise IndexInputError(f"space: expected a space string, got {type(space).__name__}")
    if dim is not None and (
        isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1
    ):
        raise IndexInputError(f"dim: must be an integer >= 1, got {dim!r}")
    m = None if space is None else _POINCARE.fullmatch(space)
    if space is None or m is not None:
        if space is None:
            if dim is None:
                raise IndexInputError("dim: required when no space string is given")
            return PoincareIndexSpace(int(dim), curvature)
        d = int(m.group(1))
        if dim is not None and int(dim) != d:
            raise IndexInputError(f"dim: {dim} does not match space {space!r} (dimension {d})")
        c = curvature
        if m.group(2) is not None:
            try:
                c = float(m.group(2))
            except ValueError:
                raise IndexInputError(f"space: bad curvature in {space!r}") from None
            if float(curvature) not in (1.0, c):
                raise IndexInputError(
                    f"curvature: {curvature} contradicts the space string {space!r}"
                )
        return PoincareIndexSpace(d, c)
    sp = ProductIndexSpace(space)
    if dim is not None and int(dim) != sp.dim:
        raise IndexInputError(f"dim: {dim} does not match space {space!r} (dimension {sp.dim})")
    return sp
