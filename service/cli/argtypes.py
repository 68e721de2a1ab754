"""argparse types of the ``hypsearch`` options: positive or non-negative numbers."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["nonneg_float", "nonneg_int", "positive_float", "positive_int"]


def _number(kind: type, *, positive: bool) -> Callable[[str], int | float]:
    """An argparse type: an int or a finite float, > 0 (``positive``) or >= 0."""
    noun = "an integer" if kind is int else "a number"

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if kind is int:
            ok, need = (
                (v >= 1, "must be at least 1") if positive else (v >= 0, "must be at least 0")
            )
        else:
            finite = v != float("inf")
            ok = (v > 0 if positive else v >= 0) and finite
            need = "must be a positive number" if positive else "must be a non-negative number"
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r} {need}")
        return v

    return parse


positive_int = _number(int, positive=True)
nonneg_int = _number(int, positive=False)
positive_float = _number(float, positive=True)
nonneg_float = _number(float, positive=False)
