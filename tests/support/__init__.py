"""Helpers shared by the test modules (no tests here; no test module imports another).

* :mod:`tests.support.training`: the hand-made WordNet slice around Fashion-MNIST,
  small label embeddings of it and a tiny training configuration.
* :mod:`tests.support.cones`: cap-construction labels, a hand-made tree, the
  Fashion-MNIST sample of the cone and placement tests and a short training run.
* :mod:`tests.support.cloud`: seeded hierarchical clouds and exact nearest neighbours
  for the index and store tests.
* :mod:`tests.support.server`: small service artifacts, indexes of Fashion-MNIST test
  images, runtimes, in-process apps and real server processes.
* :mod:`tests.support.photos`: the shipped photos (scikit-image, scikit-learn).
* :mod:`tests.support.ray_cluster`: a local Ray cluster (skip, or fail under CI).

Fixtures that several modules use live in the ``conftest.py`` of their folder.
"""
