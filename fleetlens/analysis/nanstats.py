"""NaN-skipping reductions that answer NaN for a slice with no value, without a warning.

numpy's ``nanmedian`` and ``nanmin`` warn ("All-NaN slice encountered") through ``warnings``,
which ``np.errstate`` does not silence; a run whose ranks report no ``comm`` phase, or a step
no rank reported compute for, is such a slice, and the warning reached the terminal of whoever
ran the server or the demo. A slice without values has no median: NaN is the answer, not news.
"""

from __future__ import annotations

from typing import Any, overload

import numpy as np
import numpy.typing as npt

__all__ = ["nanlowmedian", "nanmedian", "nanmin"]

Arr = npt.NDArray[Any]


@overload
def nanmedian(a: npt.ArrayLike, axis: None = None) -> float: ...
@overload
def nanmedian(a: npt.ArrayLike, axis: int) -> Arr: ...
def nanmedian(a: npt.ArrayLike, axis: int | None = None) -> float | Arr:
    """``np.nanmedian`` of ``a`` (all of it, or along ``axis``); NaN where a slice is all NaN
    or empty."""
    x = np.asarray(a, dtype=np.float64)
    if axis is None:
        v = x[~np.isnan(x)]
        return np.float64(np.median(v) if v.size else np.nan)  # numpy's division, as before
    moved = np.moveaxis(x, axis, -1)
    flat = moved.reshape(int(np.prod(moved.shape[:-1])), moved.shape[-1])
    out = np.full(flat.shape[0], np.nan)
    have = (~np.isnan(flat)).any(axis=1)
    if have.any():
        out[have] = np.nanmedian(flat[have], axis=1)
    return out.reshape(moved.shape[:-1])


def nanmin(a: npt.ArrayLike, axis: int) -> Arr:
    """``np.nanmin`` of ``a`` along ``axis``; NaN where a slice is all NaN or empty."""
    out: Arr = np.fmin.reduce(np.asarray(a, dtype=np.float64), axis=axis, initial=np.nan)
    return out


def nanlowmedian(a: npt.ArrayLike) -> Arr:
    """The lower median of each row of ``a`` (2-D), NaN skipped: of an even count the lower of
    the two middle values, so that of two ranks one slow one does not set it. NaN where a row
    has no value."""
    x = np.sort(np.asarray(a, dtype=np.float64), axis=1)  # NaN sorts last
    n = (~np.isnan(x)).sum(axis=1)
    out = np.full(x.shape[0], np.nan)
    have = n > 0
    out[have] = x[have, (n[have] - 1) // 2]
    return out
