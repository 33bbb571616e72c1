"""Data files are checked against what their headers promise before numpy allocates anything."""

import zipfile

import numpy as np
import pytest
from numpy.lib import format as npy_format

from npubuild.errors import UserError
from npubuild.quant import data

INPUT = data.InputInfo("x", (1, 3, 8, 8))


def npy_header(fh, shape):
    npy_format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": shape})


def test_a_npy_header_claiming_114_gib_is_refused(tmp_path):
    path = tmp_path / "big.npy"
    with open(path, "wb") as fh:
        npy_header(fh, (30_000_000_000,))
        fh.write(b"\0" * 64)
    with pytest.raises(UserError, match="declares shape .* but holds 64 bytes") as err:
        list(data.load_samples([path], [INPUT], 1))
    assert err.value.location.file == str(path)


def test_a_npz_that_inflates_past_the_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MAX_ARRAY_BYTES", 1 << 20)  # the same check, a small fixture
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("x.npy", "w") as fh:
        npy_header(fh, (1 << 19,))
        fh.write(b"\0" * (1 << 21))
    assert path.stat().st_size < 10_000
    with pytest.raises(UserError, match="inflates to"):
        list(data.load_samples([path], [INPUT], 1))


def test_a_npz_member_whose_header_lies_is_refused(tmp_path):
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w") as zf, zf.open("x.npy", "w") as fh:
        npy_header(fh, (1, 3, 4096, 4096))
        fh.write(b"\0" * 100)
    with pytest.raises(UserError, match="declares shape"):
        list(data.load_samples([path], [INPUT], 1))


def test_an_honest_npy_still_loads(tmp_path):
    path = tmp_path / "ok.npy"
    np.save(path, np.ones((1, 3, 8, 8), np.float32))
    (sample,) = data.load_samples([path], [INPUT], 1)
    assert sample["x"].shape == (1, 3, 8, 8)
