"""Metrics written into artifacts are the same bytes whatever the BLAS thread count: a Dask
worker runs BLAS on one thread, the driver on all cores, and both write per_layer.json and
verify.json (with OpenBLAS 0.3.31 here, ``np.dot`` of 600,000 float64 already differs in the
last bit between 1 and 2 threads)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

PROBE = """
import numpy as np
from npubuild.metrics import similarity
rng = np.random.default_rng(0)
a = rng.standard_normal(600_000)
b = a + 0.1 * rng.standard_normal(600_000)
print(repr(similarity(a, b)))
"""


def similarity_with_blas_threads(threads: int) -> str:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=REPO, check=True,
                          capture_output=True, text=True).stdout


def test_similarity_is_the_same_with_one_or_four_blas_threads():
    one = similarity_with_blas_threads(1)
    assert "cosine=0.99" in one
    assert similarity_with_blas_threads(4) == one


def test_infinities_both_hold_at_the_same_places_are_equal_values():
    import numpy as np

    from npubuild.metrics import range_errors, similarity

    reference = np.array([-np.inf, 1.0, 2.0, np.nan], np.float32)
    same = similarity(reference, reference.copy())
    assert same.identical and same.max_abs == 0 and same.cosine == pytest.approx(1.0)
    close = similarity(reference, np.array([-np.inf, 1.0, 2.5, np.nan], np.float32))
    assert close.max_abs == 0.5 and not close.identical
    assert range_errors(reference, reference.copy()) == (0.0, 0.0)


def test_an_infinity_only_one_side_holds_is_an_infinite_difference():
    import numpy as np

    from npubuild.metrics import range_errors, similarity

    reference = np.array([-np.inf, 1.0, 2.0], np.float32)
    changed = similarity(reference, np.array([-3.0, 1.0, 2.0], np.float32))
    assert changed.max_abs == np.inf and not changed.identical
    assert changed.cosine == 0.0  # a Log of an int8 zero gives -inf where float was finite
    assert range_errors(reference, np.array([np.inf, 1.0, 2.0], np.float32)) == (np.inf, np.inf)
