"""N-gram codes: n-grams of ids compared exactly, never hashed.

``ngram_codes`` packs an n-gram into one int64, code = sum_k ids[i+k] * base**(n-1-k), when
base**n < 2**63; otherwise each n-gram is a raw byte row (big-endian ids) compared as an ``np.void``
value. The overlap metrics and the Kneser-Ney model share these helpers.
"""

from __future__ import annotations

import numpy as np

from reslm.core.errors import ReslmError

_INT64_LIMIT = 2**63


def _check_n(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ReslmError(f"n must be a positive integer, got {n!r}")
    return int(n)


def _ids(x: np.ndarray | str, what: str = "ids") -> np.ndarray:
    """A 1-D non-negative integer array (no copy if already one); str -> code points (uint32)."""
    if isinstance(x, str):
        return np.frombuffer(x.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ReslmError(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ReslmError(f"{what} must be integers, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise ReslmError(f"{what} must be non-negative")
    return arr


def _check_base(ids: np.ndarray, base: int | None, what: str = "ids") -> int:
    """base (default max(ids) + 1, at least 1); raises unless every id is < base."""
    top = int(ids.max()) + 1 if ids.size else 1
    if base is None:
        return top
    if isinstance(base, bool) or not isinstance(base, (int, np.integer)) or base < 1:
        raise ReslmError(f"base must be a positive integer, got {base!r}")
    if top > base:
        raise ReslmError(f"{what} contain id {top - 1}, outside [0, base={base})")
    return int(base)


def _packed(ids: np.ndarray, n: int, base: int) -> np.ndarray:
    """int64 code of every n-gram (Horner: c <- c * base + next), shape (len(ids) - n + 1,)."""
    m = ids.size - n + 1
    code = ids[:m].astype(np.int64)
    for k in range(1, n):
        code *= base
        code += ids[k:k + m]
    return code


def _unique(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique values, their counts) by one sort (np.unique sorts more than once: slower)."""
    s = np.sort(a)
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if s.size else np.empty(0, np.intp)
    return s[starts], np.diff(np.r_[starts, s.size])


def ngram_codes(ids: np.ndarray | str, n: int, base: int | None = None) -> np.ndarray:
    """The sorted unique n-grams of ``ids``, exact (no hashing), shape (|G_n|,).

    If base**n < 2**63 they are int64 codes, code = sum_k ids[i+k] * base**(n-1-k);
    otherwise np.void rows of the n ids as big-endian unsigned integers. Results are
    comparable between sequences only for the same (n, base). base defaults to
    max(ids) + 1; a str is taken by code point. Empty when n > len(ids).
    """
    n = _check_n(n)
    ids = _ids(ids)
    base = _check_base(ids, base)
    if base**n < _INT64_LIMIT:
        if ids.size < n:
            return np.empty(0, dtype=np.int64)
        return _unique(_packed(ids, n, base))[0]
    width = 1 if base <= 1 << 8 else 2 if base <= 1 << 16 else 4 if base <= 1 << 32 else 8
    row = np.dtype((np.void, n * width))
    if ids.size < n:
        return np.empty(0, dtype=row)
    be = ids.astype(f">u{width}")  # big-endian: byte order of a row = lexicographic id order
    windows = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(be, n))
    return _unique(windows.view(row).reshape(-1))[0]


def _lookup(table: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index, found) of keys in a sorted unique table; index is clipped where not found."""
    if table.size == 0:
        return np.zeros(keys.shape, dtype=np.intp), np.zeros(keys.shape, dtype=bool)
    pos = np.minimum(np.searchsorted(table, keys), table.size - 1)
    return pos, table[pos] == keys
