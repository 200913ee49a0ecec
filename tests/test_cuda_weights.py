"""The CUDA backend's weight records (:mod:`modelc.runtime.backends.cuda_weights`), with numpy
standing in for CuPy: runs without a GPU."""

from __future__ import annotations

import numpy as np

from modelc.runtime.backends.cuda_weights import DevPart, DevWeight


def test_a_stacked_weights_parts_fill_their_own_columns() -> None:
    """``DevWeight.columns``: Q/K/V stacked as three parts (4, 2, 2 rows) hand each part the
    view of y that starts at its first output column; writing each part's rows there fills
    y exactly as one product of the stacked matrix would (a known answer)."""
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((r, 6)).astype(np.float32) for r in (4, 2, 2)]
    parts = [DevPart(data=m, code=0, rows=m.shape[0], cols=6, row_bytes=24) for m in mats]
    w = DevWeight(parts=parts, rows=8, cols=6)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    y = np.full((3, 10), np.nan, np.float32)  # wider than w.rows, as a padded scratch row
    for p, yp in w.columns(y):
        yp[:, : p.rows] = x @ p.data.T
    np.testing.assert_array_equal(y[:, :8], x @ np.concatenate(mats).T)
    assert np.isnan(y[:, 8:]).all()
    assert [yp.shape[1] for _, yp in w.columns(y)] == [10, 6, 4]
