"""A progress bar over edge or node visits, shared by training and evaluation."""

from __future__ import annotations

import torch


class _Progress:
    """tqdm over edge visits (stderr), or nothing (also when there is nothing
    to visit: the cap construction without refinement epochs printed an empty
    "0.00edge" bar)."""

    def __init__(self, total: int, enabled: bool, desc: str, unit: str = "edge"):
        self.bar = None
        if enabled and total > 0:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=True)
        self.leaves: torch.Tensor | None = None

    def advance(self, k: int) -> None:
        if self.bar is not None:
            self.bar.update(k)

    def post(self, **kw) -> None:
        if self.bar is not None:
            self.bar.set_postfix(**kw)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
