r"""Novelty of an image for the classes a model was trained on, from its encoder features.

An image of a class the model never saw (``hypsearch train --holdout``) is
mapped by the head as confidently as any other: its posterior over the
trained classes says "gym shoe" or "boot" for 997 sandals of 1,000, and the distance
to the class's point does not tell it apart (AUROC 0.60 on the held-out
classes of the zero-shot run of benchmarks/results/zero-shot.md). Its *encoder features* do:
:class:`FeatureNovelty` is the Mahalanobis score of Lee et al. (2018) —
class-conditional Gaussians with one shared covariance, fitted on the
training images of the trained classes — computed on the features scaled to
unit length (which raised its AUROC on the held-out classes from 0.76 to
0.85; a nearest-neighbour score over 12,000 training features, Sun et al.
2022, reached 0.86 and would keep 6 MB of features in the checkpoint):

.. math::

    s(f) = \min_k (\hat f - \mu_k)^\top \Sigma^{-1} (\hat f - \mu_k),
    \qquad \hat f = f / \|f\|.

The threshold is a quantile of the scores of validation images of the
trained classes (:meth:`FeatureNovelty.calibrate`): ``rate`` is the share of
them the rule calls novel, the price paid in seen images for catching unseen
ones (:class:`models.vision.placement.ConePlacement` then places a novel image in the
cone of a declared unseen class, or backs it off to its class's parent).
"""

from __future__ import annotations

import torch

__all__ = ["FeatureNovelty"]

#: ridge added to the shared covariance (unit-length features: a fraction of their scale)
RIDGE = 1e-6


class FeatureNovelty:
    """Mahalanobis novelty of unit-length encoder features (module docstring).

    ``means`` (K, F) and ``precision`` (F, F) float64; ``threshold``: scores above
    it are novel (``inf``: nothing is).
    """

    def __init__(self, means: torch.Tensor, precision: torch.Tensor, threshold: float):
        if means.dim() != 2 or precision.shape != (means.shape[1], means.shape[1]):
            raise ValueError(
                f"novelty statistics do not fit: means {tuple(means.shape)}, "
                f"precision {tuple(precision.shape)}"
            )
        # contiguous: a reloaded checkpoint's tensors are, and the matrix products (hence
        # the last bits of the scores and of the placed points) depend on the layout
        self.means = means.to(torch.float64).contiguous()
        self.precision = precision.to(torch.float64).contiguous()
        self.threshold = float(threshold)

    @classmethod
    def fit(cls, features: torch.Tensor, targets: torch.Tensor) -> FeatureNovelty:
        """Class means and the shared covariance's inverse of ``features`` (n, F) whose
        classes are ``targets`` (n,) in ``0..K-1`` (every class needs an image)."""
        x = _unit(features)
        targets = torch.as_tensor(targets, dtype=torch.int64)
        k = int(targets.max()) + 1 if len(targets) else 0
        counts = torch.bincount(targets, minlength=k)
        if k == 0 or bool((counts == 0).any()):
            raise ValueError("novelty statistics need at least one image of every class")
        means = torch.zeros(k, x.shape[1], dtype=torch.float64).index_add_(0, targets, x)
        means /= counts[:, None].to(torch.float64)
        r = x - means[targets]
        cov = r.T @ r / len(x) + RIDGE * torch.eye(x.shape[1], dtype=torch.float64)
        return cls(means, torch.linalg.inv(cov), float("inf"))

    def scores(self, features: torch.Tensor) -> torch.Tensor:
        """Novelty score (n,) float64 of features (n, F): the smallest class distance."""
        x = _unit(features)
        if len(x) == 0:
            return torch.zeros(0, dtype=torch.float64)
        # (x - mu)^T P (x - mu) = x^T P x - 2 x^T P mu + mu^T P mu, for all classes at once
        xp = x @ self.precision
        quad = (xp * x).sum(1, keepdim=True)
        cross = xp @ self.means.T
        mm = ((self.means @ self.precision) * self.means).sum(1)
        return (quad - 2 * cross + mm[None, :]).min(1).values.clamp_min(0.0)

    def novel(self, features: torch.Tensor) -> torch.Tensor:
        """Which rows are novel, (n,) bool."""
        return self.scores(features) > self.threshold

    def calibrate(self, features: torch.Tensor, rate: float) -> float:
        """Set (and return) the threshold that calls ``rate`` of ``features`` novel
        (images of the trained classes the model did not train on: validation)."""
        if not (0 <= rate < 1):
            raise ValueError(f"novelty rate must be in [0, 1), got {rate}")
        s = self.scores(features)
        if rate == 0 or len(s) == 0:
            self.threshold = float("inf")
        else:
            self.threshold = float(torch.quantile(s, 1 - rate))
        return self.threshold

    def tensors(self) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps (the threshold goes in the config)."""
        return {"means": self.means, "precision": self.precision}


def _unit(features: torch.Tensor) -> torch.Tensor:
    x = torch.as_tensor(features).to(torch.float64)
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
