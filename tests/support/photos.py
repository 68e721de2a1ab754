"""The shipped photos of the pretrained-backbone tests: pictures that come with
scikit-image and scikit-learn (no download)."""

from __future__ import annotations

import os


def _skimage(name: str) -> str:
    import skimage

    return os.path.join(os.path.dirname(skimage.__file__), "data", name)


def _sklearn(name: str) -> str:
    import sklearn.datasets

    return os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", name)


PHOTOS = {
    "chelsea": _skimage("chelsea.png"),  # a cat
    "coffee": _skimage("coffee.png"),  # a cup of espresso
    "motorcycle": _skimage("motorcycle_left.png"),
    "rocket": _skimage("rocket.jpg"),
    "china": _sklearn("china.jpg"),  # a temple
    "flower": _sklearn("flower.jpg"),
}
