"""Overlap-n and distinct-n of generated text against a reference (the test text).

With G_n the set of *unique* n-grams of the generated text and R_n that of the reference
(test) text::

    overlap_n  = |G_n ∩ R_n| / |G_n|
    distinct_n = |G_n| / (len(generated) - n + 1)     (unique / total n-grams)

A repeated n-gram counts once. Both are undefined when the generated text has no n-gram
(n > len(generated)): they return ``nan``. A reference shorter than n has R_n = {}, so the
overlap is 0.0. ``NgramReference`` builds R_n once per n (lazily) and reuses it for any
number of generated texts.

A str reference fixes the alphabet: its V characters are ids 0..V-1, and R_n is packed with
base V + 1. Generated characters outside that alphabet are all mapped onto the id V for the
intersection (no reference n-gram contains it, so that is exact), and |G_n| is counted
separately on the generated text's own characters, so distinct unseen characters stay
distinct: "abxaby" against "abab", n = 2, is 1/4 (ab, bx, xa, by; only ab in R_2).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from reslm.core.errors import ReslmError
from reslm.ngram.codes import _check_base, _check_n, _ids, _lookup, _unique, ngram_codes


class NgramReference:
    """The unique n-grams R_n of a reference text, built once per n and cached.

    ``reference``: an id array (ids < ``base``, default max + 1; pass the vocabulary size
    so generated ids above the reference's largest id are accepted) or a str. For a str
    reference, generated text must be str too: its characters are mapped onto the
    reference's characters and any other character onto one extra id, which no reference
    n-gram contains, so the intersection is exact; |G_n| is counted on the generated
    text's own characters, so two different unseen characters are two symbols.
    """

    def __init__(self, reference: np.ndarray | str, base: int | None = None):
        self.is_text = isinstance(reference, str)
        ids = _ids(reference, "reference")
        if self.is_text:
            if base is not None:
                raise ReslmError("base is only for id arrays; a str reference sets its own")
            self._chars = _unique(ids)[0]  # sorted code points, (V,)
            ids = np.searchsorted(self._chars, ids)
            self.base = self._chars.size + 1  # + one id for characters not in the reference
        else:
            self.base = _check_base(ids, base, "reference ids")
        self.ids = ids
        self._codes: dict[int, np.ndarray] = {}

    def codes(self, n: int) -> np.ndarray:
        """R_n as ``ngram_codes(reference, n, base)`` (computed on first use)."""
        n = _check_n(n)
        if n not in self._codes:
            self._codes[n] = ngram_codes(self.ids, n, self.base)
        return self._codes[n]

    def _map(self, generated: np.ndarray | str) -> tuple[np.ndarray, np.ndarray | None]:
        """(ids for the intersection with R_n, compact ids of the generated text or None).

        The second is set only when the text has characters outside the reference: the
        first then maps all of them onto one id, so |G_n| must be counted on the second.
        """
        if isinstance(generated, str) != self.is_text:
            raise ReslmError("generated and reference must both be str or both be id arrays")
        ids = _ids(generated, "generated ids")
        if not self.is_text:
            _check_base(ids, self.base, "generated ids")
            return ids, None
        pos, known = _lookup(self._chars, ids)
        if known.all():
            return pos, None
        compact = np.searchsorted(_unique(ids)[0], ids)  # one id per distinct character
        return np.where(known, pos, self._chars.size), compact

    def _overlap(self, mapped: tuple[np.ndarray, np.ndarray | None], n: int) -> float:
        ids, compact = mapped
        g = ngram_codes(ids, n, self.base)
        if g.size == 0:
            return float("nan")
        found = np.count_nonzero(_lookup(self.codes(n), g)[1])
        total = g.size if compact is None else ngram_codes(compact, n).size
        return float(found) / total

    def overlap(self, generated: np.ndarray | str, n: int) -> float:
        """|G_n ∩ R_n| / |G_n| over unique n-grams; nan if n > len(generated)."""
        return self._overlap(self._map(generated), _check_n(n))

    def overlaps(self, generated: np.ndarray | str, ns: Iterable[int] = (7, 8)) -> dict[int, float]:
        """{n: overlap(generated, n)} for each n in ns."""
        mapped = self._map(generated)
        return {int(n): self._overlap(mapped, _check_n(n)) for n in ns}


def overlap_n(generated: np.ndarray | str, reference: np.ndarray | str, n: int,
              base: int | None = None) -> float:
    """|G_n ∩ R_n| / |G_n| over unique n-grams (see the module docstring); nan if G_n = {}."""
    return NgramReference(reference, base).overlap(generated, n)


def distinct_n(generated: np.ndarray | str, n: int) -> float:
    """|G_n| / (len(generated) - n + 1): unique over total n-grams; nan if n > len(generated)."""
    n = _check_n(n)
    ids = _ids(generated, "generated ids")
    if ids.size < n:
        return float("nan")
    ids = np.searchsorted(_unique(ids)[0], ids)  # compact ids: smallest base, int64 path
    return ngram_codes(ids, n).size / (ids.size - n + 1)
