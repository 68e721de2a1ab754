"""The hand-made WordNet slice around the Fashion-MNIST classes, small label
embeddings of it and a tiny image-training configuration."""

from __future__ import annotations

import os

import pytest

FMNIST = "/usr/share/datasets/fashion-mnist"
needs_fmnist = pytest.mark.skipif(
    not os.path.isdir(FMNIST), reason=f"Fashion-MNIST not installed at {FMNIST}"
)

#: a hand-made slice of WordNet around the Fashion-MNIST classes
EDGES = [
    ("jersey.n.03", "shirt.n.01"),
    ("shirt.n.01", "garment.n.01"),
    ("trouser.n.01", "garment.n.01"),
    ("pullover.n.01", "sweater.n.01"),
    ("sweater.n.01", "garment.n.01"),
    ("dress.n.01", "woman's_clothing.n.01"),
    ("woman's_clothing.n.01", "clothing.n.01"),
    ("coat.n.01", "overgarment.n.01"),
    ("overgarment.n.01", "garment.n.01"),
    ("garment.n.01", "clothing.n.01"),
    ("sandal.n.01", "shoe.n.01"),
    ("gym_shoe.n.01", "shoe.n.01"),
    ("oxford.n.04", "shoe.n.01"),
    ("shoe.n.01", "footwear.n.02"),
    ("boot.n.01", "footwear.n.02"),
    ("footwear.n.02", "covering.n.02"),
    ("clothing.n.01", "covering.n.02"),
    ("bag.n.04", "container.n.01"),
    ("covering.n.02", "entity.n.01"),
    ("container.n.01", "entity.n.01"),
]


def small_labels(dim: int = 6):
    """Label embeddings of :data:`EDGES` (20 epochs, seeded)."""
    from models.labels import LabelTrainConfig, train_labels
    from models.taxonomy.graph import Taxonomy

    tax = Taxonomy.from_edges(EDGES)
    return train_labels(tax, LabelTrainConfig(dim=dim, epochs=20, burnin=2, seed=0))


def tiny_config(**kw):
    """A :class:`models.training.run.TrainConfig` for a short run (``kw`` on top)."""
    from models.training.run import TrainConfig

    base = dict(
        epochs=1,
        limit=2000,
        batch_size=64,
        widths=[8, 16, 32, 32],
        warmup_iters=5,
        lr=3e-3,
        val_fraction=0.1,
        seed=0,
    )
    return TrainConfig(**(base | kw))


def shapes_folder(root, n=24, size=40, seed=0):
    """Two classes of synthetic RGB pictures: light squares and light crosses on dark."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for cls in ("boots", "sandals"):
        (root / cls).mkdir(parents=True)
        for i in range(n):
            a = rng.integers(0, 40, (size, size, 3)).astype(np.uint8)
            c = rng.integers(10, size - 10, 2)
            if cls == "boots":
                a[c[0] - 6 : c[0] + 6, c[1] - 6 : c[1] + 6] = 220
            else:
                a[c[0] - 8 : c[0] + 8, c[1] - 1 : c[1] + 2] = 220
                a[c[0] - 1 : c[0] + 2, c[1] - 8 : c[1] + 8] = 220
            Image.fromarray(a).save(root / cls / f"{i:03d}.png")
