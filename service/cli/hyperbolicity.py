"""``hypsearch hyperbolicity``: the Gromov delta of vectors or a data set, and the
curvature it suggests."""

from __future__ import annotations

import argparse

from .argtypes import positive_int
from .common import add_common, command, emit, need_path
from .errors import CliError

_HYPERBOLICITY_HELP = (
    "Gromov delta-hyperbolicity of vectors or a dataset, and the curvature it suggests"
)

_HYPERBOLICITY_DESCRIPTION = (
    "delta, delta_rel = 2 delta / diameter and c = (0.144 / delta_rel)^2 "
    "(Khrulkov et al. 2020) of a sample of points."
)


def read_vectors(path: str):
    import numpy as np

    p = need_path("--vectors", path)
    try:
        if p.suffix == ".npy":
            x = np.load(p, allow_pickle=False)
        else:
            x = np.loadtxt(p, comments="#", delimiter=None, ndmin=2)
    except ValueError as e:
        raise CliError(f"--vectors {path}: not a numeric matrix ({e})") from None
    if x.ndim != 2 or x.shape[0] < 4:
        raise CliError(
            f"--vectors {path}: need a 2-d matrix with at least 4 rows, got shape {x.shape}"
        )
    if not np.isfinite(x).all():
        raise CliError(f"--vectors {path}: contains NaN or infinite values")
    return x.astype(np.float64)


def cmd_hyperbolicity(args: argparse.Namespace) -> int:
    import numpy as np

    from models.geometry.delta import delta_hyperbolicity

    if args.vectors:
        x = read_vectors(args.vectors)
        source = args.vectors
    else:
        from models.images.datasets import load_fashion_mnist

        data = load_fashion_mnist(args.split, args.data_dir)
        x = data.images.reshape(len(data.images), -1).astype(np.float64) / 255.0
        source = f"{args.dataset}:{args.split} (pixels)"
    result = delta_hyperbolicity(x, n_samples=args.samples, seed=args.seed, metric=args.metric)
    result = {k: float(v) for k, v in result.items()} | {"source": source, "points": int(len(x))}
    return emit(
        args,
        result,
        lambda r: (
            f"{r['source']}: delta={r['delta']:.4f} diameter={r['diameter']:.4f} "
            f"delta_rel={r['delta_rel']:.4f} suggested curvature c={r['suggested_curvature']:.4f}"
        ),
    )


def add_commands(sub) -> None:
    """Add ``hyperbolicity`` to the ``hypsearch`` subparsers."""
    from models.images.datasets import DEFAULT_FASHION_MNIST_DIR

    hy = command(
        sub, "hyperbolicity", cmd_hyperbolicity, _HYPERBOLICITY_HELP, _HYPERBOLICITY_DESCRIPTION
    )
    src = hy.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--vectors", help=".npy file or whitespace-separated text matrix (one vector a row)"
    )
    src.add_argument("--dataset", choices=["fashion-mnist"], help="a built-in dataset (raw pixels)")
    hy.add_argument("--split", default="test", choices=["train", "test"])
    hy.add_argument("--data-dir", default=DEFAULT_FASHION_MNIST_DIR)
    hy.add_argument("--metric", default="euclidean", choices=["euclidean", "poincare"])
    hy.add_argument("--samples", type=positive_int, default=1500)
    hy.add_argument("--seed", type=int, default=0)
    add_common(hy)
