"""The data roots: the folders that index jobs, server-side models and taxonomies,
and pictures stored by path may be read from (``HYPSEARCH_DATA_ROOTS``).

One rule, here only: a path is under a root when its real path (symlinks
resolved) is the root or lies inside it. :func:`check_under_roots` checks a path
a request names (and refuses relative paths, ``..`` components and NUL bytes);
:func:`inside_roots` is the same rule as a test of real paths, which the
listing of a folder or manifest (:func:`models.images.datasets.list_folder`,
``inside=``) applies to each class folder and file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["BuildInputError", "OutsideRootsError", "check_under_roots", "inside_roots"]


class BuildInputError(ValueError):
    """A source that cannot be read at all (missing folder, bad manifest header, path
    outside the roots); the message names it."""


class OutsideRootsError(BuildInputError):
    """A path outside the allowed data roots (or no roots are configured)."""


def inside_roots(roots: Sequence[str | os.PathLike]) -> Callable[[Path], bool]:
    """``inside(real)``: whether a real path is one of ``roots`` or lies under one
    (the roots' own symlinks resolved once, here)."""
    real_roots = [Path(os.path.realpath(r)) for r in roots]

    def inside(real: Path) -> bool:
        return any(real == r or r in real.parents for r in real_roots)

    return inside


def check_under_roots(
    path: str | os.PathLike, roots: Sequence[str | os.PathLike], what: str = "path"
) -> Path:
    """The real path of ``path`` if it lies under one of ``roots`` (after
    symlinks); refuses relative paths, ``..`` components, NUL bytes and anything
    else."""
    if "\0" in os.fspath(path):
        raise BuildInputError(f"{what}: {str(path)!r} contains a NUL byte (not allowed)")
    p = Path(path)
    if ".." in p.parts:
        raise BuildInputError(f"{what}: {path} contains '..' (not allowed)")
    if not p.is_absolute():
        raise BuildInputError(f"{what}: {path} is not an absolute path")
    if not roots:
        raise OutsideRootsError(f"{what}: no data roots are configured (HYPSEARCH_DATA_ROOTS)")
    try:
        real = Path(os.path.realpath(p))
    except (OSError, ValueError) as e:
        raise BuildInputError(f"{what}: {path} cannot be resolved ({e})") from None
    if inside_roots(roots)(real):
        return real
    raise OutsideRootsError(f"{what}: {path} is outside the data roots")
