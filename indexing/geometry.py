"""The index's view of a space: validation, exact distances, ranking proxies.

Every exact distance goes through :mod:`models.geometry` (the project's single
implementation of each formula); this module only adapts numpy arrays to it.
``models.geometry`` (and so torch) is imported lazily, on the first exact
distance, so a process that only writes to a store starts fast.

Two things here are not distances and are computed locally:

* the *ranking proxy* of the exact backend for the Poincaré ball: for a query
  ``q`` the key ``|x - q|^2 / (1 - c|x|^2)`` is the arcosh argument up to a
  factor that does not depend on ``x``, so it orders items like the geodesic
  distance does.  It is evaluated in float32 (differences, not the
  ``|x|^2 + |q|^2 - 2<x, q>`` expansion, which cancels catastrophically near the
  boundary) and only selects candidates: those are re-ranked in float64 by
  ``models.geometry.poincare.dist``;
* *deep* points: float32 cannot tell apart points whose gap ``1 - c|x|^2`` is
  below :data:`DEEP_GAP` (hyperbolic radius above about 12.9/sqrt(c); at
  radius 20 a float32 coordinate step is already a hyperbolic distance of
  about 2).  A query that deep is ranked with the float64 proxy
  (:meth:`Space.proxy_keys64`), and the HNSW backend keeps deep items out of
  its float32 graph and scans them in float64;
* nothing else: :meth:`PoincareSpace.euclidean_ball` (where the HNSW backend
  aims its Euclidean graph search) calls ``models.geometry.poincare.euclidean_ball``.
"""

from __future__ import annotations

import math
import re
import threading
from abc import ABC, abstractmethod
from contextlib import contextmanager

import numpy as np

from .errors import IndexInputError

__all__ = [
    "Space",
    "PoincareSpace",
    "ProductIndexSpace",
    "make_space",
    "fmt_float",
    "torch_threads",
    "TORCH_THREADS",
    "DEEP_GAP",
]

#: Points whose gap ``1 - c|x|^2`` is below this are "deep": float32 ranking is
#: not reliable for them (see the module docstring).
DEEP_GAP = 1e-5

#: torch intra-op threads while the index computes distances (``None``: leave
#: torch alone).  The index's tensors are small (a few thousand rows): torch's
#: thread pool costs more than it gains there, and on a busy 2-core machine a
#: 2-thread float64 ``poincare.dist`` over 42k pairs measured 1.2 s against
#: 0.08 s single-threaded.  The index's parallelism is its concurrent searches.
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


def fmt_float(x: float) -> str:
    """Short but unambiguous float text for messages (``1.0000002``, ``1.0``)."""
    s = f"{float(x):.9g}"
    if not any(ch in s for ch in ".eni"):
        s += ".0"
    return s


class Space(ABC):
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
    @abstractmethod
    def dist_rows(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Exact float64 distances ``d(q[i], x[i, j])``:
        q ``(n, d)``, x ``(n, m, d)`` -> ``(n, m)``."""

    @abstractmethod
    def pairwise(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Exact float64 distance matrix ``(n, d), (m, d) -> (n, m)``."""

    # -- ranking proxy (float32) --------------------------------------------
    @abstractmethod
    def proxy_prepare(self, x: np.ndarray):
        """Per-item data for :meth:`proxy_keys` from float64 items ``(m, d)``."""

    @abstractmethod
    def proxy_keys(self, q: np.ndarray, prepared) -> np.ndarray:
        """float32 keys ``(n, m)`` ordered like the distances from ``q[i]``."""

    @abstractmethod
    def proxy_rows(self, q: np.ndarray, rows) -> np.ndarray:
        """float32 keys ``(n, m)`` of gathered prepared data (arrays ``(n, m, ...)``)."""

    @abstractmethod
    def deep(self, x: np.ndarray) -> np.ndarray:
        """Boolean mask of the rows too close to the boundary for float32 ranking."""

    @abstractmethod
    def proxy_keys64(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        """float64 keys ``(n, m)`` from float64 items ``(m, d)`` (for deep queries)."""

    def proxy_take(self, prepared, rows: np.ndarray):
        """The prepared data of a subset of items."""
        return tuple(p[rows] for p in prepared)


class PoincareSpace(Space):
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
    def radius(self) -> float:
        return 1.0 / math.sqrt(self.c)

    def _check_members(self, a: np.ndarray, name: str) -> None:
        sq = np.einsum("ij,ij->i", a, a)
        outside = self.c * sq >= 1.0
        if outside.any():
            i = int(np.nonzero(outside)[0][0])
            raise IndexInputError(
                f"{name}[{i}]: norm {fmt_float(math.sqrt(sq[i]))} is outside the ball of "
                f"curvature {fmt_float(self.c)} (must be < {fmt_float(self.radius)})"
            )

    def dist_rows(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        torch = _torch()
        with torch_threads():
            d = _poincare().dist(
                torch.from_numpy(np.ascontiguousarray(q, dtype=np.float64))[:, None, :],
                torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)),
                c=self.c,
            )
        return d.numpy()

    def pairwise(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        torch = _torch()
        with torch_threads():
            return (
                _poincare()
                .pairwise_dist(
                    torch.from_numpy(np.ascontiguousarray(q, dtype=np.float64)),
                    torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)),
                    c=self.c,
                )
                .numpy()
            )

    # ranking proxy: key(q, x) = |x - q|^2 * w(x), w(x) = 1 / (1 - c|x|^2); the
    # arcosh argument is z = 2c key / (1 - c|q|^2).
    def _inv_gap(self, x: np.ndarray) -> np.ndarray:
        g = 1.0 - self.c * np.einsum("ij,ij->i", x, x)
        return 1.0 / np.maximum(g, 1e-300)

    def proxy_weight(self, x: np.ndarray) -> np.ndarray:
        """``w(x) = 1 / (1 - c|x|^2)`` in float64 (the proxy's per-item factor)."""
        return self._inv_gap(np.asarray(x, dtype=np.float64))

    def deep(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return 1.0 - self.c * np.einsum("ij,ij->i", x, x) < DEEP_GAP

    def proxy_keys64(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        torch = _torch()
        x = np.ascontiguousarray(x, dtype=np.float64)
        w = torch.from_numpy(self._inv_gap(x))
        with torch_threads():
            e = torch.cdist(
                torch.from_numpy(np.ascontiguousarray(q, dtype=np.float64)),
                torch.from_numpy(x),
                compute_mode="donot_use_mm_for_euclid_dist",
            )
            return (e.square_() * w[None, :]).numpy()

    def proxy_prepare(self, x: np.ndarray):
        x = np.asarray(x, dtype=np.float64)
        # w in float64 (float32 coordinates of a point very near the boundary
        # may round onto the sphere), stored as float32.
        return (x.astype(np.float32), self._inv_gap(x).astype(np.float32))

    def proxy_keys(self, q: np.ndarray, prepared) -> np.ndarray:
        torch = _torch()
        x32, w = prepared
        q32 = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32))
        with torch_threads():
            e = torch.cdist(q32, torch.from_numpy(x32), compute_mode="donot_use_mm_for_euclid_dist")
            return (e.square_() * torch.from_numpy(w)[None, :]).numpy()

    def proxy_rows(self, q: np.ndarray, rows) -> np.ndarray:
        x32, w = rows  # (n, m, d), (n, m)
        diff = x32 - np.asarray(q, dtype=np.float32)[:, None, :]
        return np.einsum("nmd,nmd->nm", diff, diff) * w

    def radius_from_key(self, q: np.ndarray, key: np.ndarray) -> np.ndarray:
        """Approximate geodesic distance from a proxy key (inf stays inf)."""
        torch = _torch()
        z = 2.0 * self.c * np.asarray(key, dtype=np.float64) * self._inv_gap(q)
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


class ProductIndexSpace(Space):
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

    def _check_members(self, a: np.ndarray, name: str) -> None:
        start = 0
        for f in self.ps.factors:
            part = a[:, start : start + f.dim]
            if f.kind == "poincare":
                sq = np.einsum("ij,ij->i", part, part)
                outside = f.curvature * sq >= 1.0
                if outside.any():
                    i = int(np.nonzero(outside)[0][0])
                    raise IndexInputError(
                        f"{name}[{i}]: coordinates {start}:{start + f.dim} (factor {f}) have norm "
                        f"{fmt_float(math.sqrt(sq[i]))}, outside the ball of curvature "
                        f"{fmt_float(f.curvature)} "
                        f"(must be < {fmt_float(1 / math.sqrt(f.curvature))})"
                    )
            start += f.dim

    def dist_rows(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        torch = _torch()
        with torch_threads():
            return self.ps.dist(
                torch.from_numpy(np.ascontiguousarray(q, dtype=np.float64))[:, None, :],
                torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)),
            ).numpy()

    def pairwise(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        torch = _torch()
        with torch_threads():
            return self.ps.pairwise_dist(
                torch.from_numpy(np.ascontiguousarray(q, dtype=np.float64)),
                torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)),
            ).numpy()

    # ranking proxy: there is no per-factor monotone shortcut for
    # sqrt(sum d_i^2), so the proxy is the product distance itself, in float32,
    # through models.geometry.
    def proxy_prepare(self, x: np.ndarray):
        return (np.asarray(x, dtype=np.float32),)

    def proxy_keys(self, q: np.ndarray, prepared) -> np.ndarray:
        torch = _torch()
        (x32,) = prepared
        with torch_threads():
            d = self.ps.pairwise_dist(
                torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)), torch.from_numpy(x32)
            )
        return np.nan_to_num(d.numpy().astype(np.float32, copy=False), nan=np.inf)

    def deep(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        out = np.zeros(len(x), dtype=bool)
        start = 0
        for f in self.ps.factors:
            if f.kind == "poincare":
                part = x[:, start : start + f.dim]
                out |= 1.0 - f.curvature * np.einsum("ij,ij->i", part, part) < DEEP_GAP
            start += f.dim
        return out

    def proxy_keys64(self, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        return self.pairwise(q, x)

    def proxy_rows(self, q: np.ndarray, rows) -> np.ndarray:
        torch = _torch()
        (x32,) = rows
        with torch_threads():
            d = self.ps.dist(
                torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32))[:, None, :],
                torch.from_numpy(np.ascontiguousarray(x32)),
            )
        return np.nan_to_num(d.numpy().astype(np.float32, copy=False), nan=np.inf)


_POINCARE = re.compile(r"\s*poincare\s*:\s*([0-9]+)\s*(?:@\s*([^\s,]+)\s*)?")


def make_space(dim, curvature: float = 1.0, space: str | None = None) -> Space:
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
            return PoincareSpace(int(dim), curvature)
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
        return PoincareSpace(d, c)
    sp = ProductIndexSpace(space)
    if dim is not None and int(dim) != sp.dim:
        raise IndexInputError(f"dim: {dim} does not match space {space!r} (dimension {sp.dim})")
    return sp
