"""Metrics written into artifacts are the same bytes whatever the BLAS thread count: a Dask
worker runs BLAS on one thread, the driver on all cores, and both write per_layer.json and
verify.json (with OpenBLAS 0.3.31 here, ``np.dot`` of 600,000 float64 already differs in the
last bit between 1 and 2 threads)."""

from __future__ import annotations

import os
import subprocess
import sys

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
