"""Fixtures of the models tests.

* ``fm_cap`` (module scope): ``(labels, data, test)`` of
  :func:`tests.support.cones.fm_cap_sample` (skips without Fashion-MNIST).
"""

from __future__ import annotations

import pytest

from tests.support.cones import fm_cap_sample


@pytest.fixture(scope="module")
def fm_cap():
    return fm_cap_sample()
