"""Evaluation of generated text: n-gram overlap / distinct-n, and the Kneser-Ney baseline.

Everything works on 1-D integer id arrays (uint8/uint16/int64, ids in ``[0, base)``); the
overlap and distinct functions also take ``str`` (characters, compared by code point).

Overlap and distinct-n
----------------------
With G_n the set of *unique* n-grams of the generated text and R_n that of the reference
(test) text::

    overlap_n  = |G_n ∩ R_n| / |G_n|
    distinct_n = |G_n| / (len(generated) - n + 1)     (unique / total n-grams)

A repeated n-gram counts once. Both are undefined when the generated text has no n-gram
(n > len(generated)): they return ``nan``. A reference shorter than n has R_n = {}, so the
overlap is 0.0. ``NgramReference`` builds R_n once per n (lazily) and reuses it for any
number of generated texts.

N-grams are compared exactly, never hashed: ``ngram_codes`` packs an n-gram into one int64,
code = sum_k ids[i+k] * base**(n-1-k), when base**n < 2**63; otherwise each n-gram is a raw
byte row (big-endian ids) compared as an ``np.void`` value.

A str reference fixes the alphabet: its V characters are ids 0..V-1, and R_n is packed with
base V + 1. Generated characters outside that alphabet are all mapped onto the id V for the
intersection (no reference n-gram contains it, so that is exact), and |G_n| is counted
separately on the generated text's own characters, so distinct unseen characters stay
distinct: "abxaby" against "abab", n = 2, is 1/4 (ab, bx, xa, by; only ab in R_2).

Kneser-Ney
----------
``KneserNey`` is an interpolated *modified* Kneser-Ney model (Chen & Goodman 1998), see its
docstring; ``select_order`` picks its order on held-out training text.

Costs: every step is a few sorts and searches over int64 codes (no Python loop over positions), so
fitting and scoring grow with the number of ids times the order; on Shakespeare select_order picks
the largest order whose codes fit int64 at its vocabulary (timings and held-out losses:
docs/design-figures.md).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

from reslm.core.errors import ReslmError
from reslm.generate import pick

_INT64_LIMIT = 2**63
_MIN_DISCOUNT = 0.1  # floor of an estimated discount: keeps every gamma(h) > 0
_CHUNK = 1 << 20  # positions scored at once by KneserNey (bounds evaluation memory)


# --- ids and n-gram codes ----------------------------------------------------------------


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


# --- Kneser-Ney --------------------------------------------------------------------------


def _estimate_discounts(counts: np.ndarray) -> tuple[float, float, float]:
    """Modified-KN discounts (D1, D2, D3+) from the counts of counts n_1..n_4 (Chen & Goodman).

    Y = n1 / (n1 + 2 n2), D_k = k - (k + 1) Y n_{k+1} / n_k. If some n_k (k <= 4) is 0 (tiny
    corpora) all three are Y (0.5 if n1 or n2 is 0). Each D_k is clipped to [0.1, k].
    """
    n1, n2, n3, n4 = np.bincount(np.minimum(counts, 5), minlength=6)[1:5].astype(float)
    y = n1 / (n1 + 2 * n2) if n1 > 0 and n2 > 0 else 0.5
    if min(n1, n2, n3, n4) > 0:
        d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    else:
        d = (y, y, y)
    return tuple(float(np.clip(dk, _MIN_DISCOUNT, k)) for k, dk in enumerate(d, start=1))


class _Order:
    """One order k of the model: every k-gram g = (h, w) with a count N(g) > 0.

    own(g)   = (N(g) - D(N(g))) / N(h), N(h) = sum_w N(h w)
    gamma(h) = sum_w D(N(h w)) / N(h)    (= (D1 n1(h) + D2 n2(h) + D3 n3+(h)) / N(h))
    so sum_w own(h w) + gamma(h) = 1 for every stored history h.
    """

    def __init__(self, codes: np.ndarray, counts: np.ndarray, vocab_size: int,
                 discounts: tuple[float, float, float]):
        self.codes = codes  # (G,) sorted int64 k-gram codes
        self.discounts = discounts
        hist = codes // vocab_size  # (G,) nondecreasing history codes
        starts = np.flatnonzero(np.r_[True, hist[1:] != hist[:-1]])  # (H,)
        self.hist = hist[starts]  # (H,) sorted unique histories
        d = np.array((0.0,) + discounts)[np.minimum(counts, 3)]  # (G,) D(N(g))
        total = np.add.reduceat(counts, starts).astype(float)  # (H,) N(h)
        self.gamma = np.add.reduceat(d, starts) / total  # (H,)
        self.own = (counts - d) / np.repeat(total, np.diff(np.r_[starts, codes.size]))  # (G,)


class KneserNey:
    """Interpolated modified Kneser-Ney n-gram model over ids in [0, vocab_size).

    For a k-gram h w (history h of k - 1 symbols, k = 1..order), with p_0(w) = 1 / V::

        p_k(w | h) = (N_k(h w) - D_k(N_k(h w))) / N_k(h) + gamma_k(h) p_{k-1}(w | h')
        gamma_k(h) = (D_k1 n1(h) + D_k2 n2(h) + D_k3+ n3+(h)) / N_k(h)

    h' is h without its first symbol; N_k(h) = sum_w N_k(h w); n_j(h) is the number of
    symbols w with N_k(h w) = j (n3+: >= 3). N_k is the raw count c(h w) at the highest
    order and the continuation count N1+(. h w) (distinct symbols seen before h w) below.
    D(0) = 0, and D(c) = (D_k1, D_k2, D_k3+) for c = 1, 2, >= 3 are estimated per order
    from that order's counts of counts (``_estimate_discounts``), or all equal to a
    fixed ``discount`` (plain interpolated KN; 0 = no smoothing, unseen events then get
    probability 0). A history never seen at order k (N_k(h) = 0) falls back entirely:
    p_k = p_{k-1}. The recursion ends in the uniform p_0, so with estimated discounts
    every symbol has probability > 0.

    Scoring ``ids`` predicts positions ``start`` (default 1) .. len - 1; position t uses the
    history ids[max(0, t - order + 1):t], so the first positions use shorter histories
    (position 0, start=0, the order-1 distribution).

    Codes are int64 (code = sum_k ids[i+k] V**(n-1-k)), so vocab_size**order < 2**63 is
    required. Training text is the plain concatenation it is given: the first k-gram has
    no predecessor and so no continuation count.
    """

    def __init__(self, order: int, vocab_size: int, discount: float | None = None):
        if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order < 1:
            raise ReslmError(f"order must be a positive integer, got {order!r}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
                or vocab_size < 1:
            raise ReslmError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        if int(vocab_size) ** int(order) >= _INT64_LIMIT:
            raise ReslmError(f"vocab_size**order = {vocab_size}**{order} does not fit int64 "
                             f"n-gram codes; use a lower order")
        if discount is not None and not 0 <= discount <= 1:
            raise ReslmError(f"discount must be in [0, 1] or None (estimated), got {discount}")
        self.order = int(order)
        self.vocab_size = int(vocab_size)
        self.discount = discount
        self._orders: list[_Order] = []  # index k - 1 -> order k

    def _check(self, ids: np.ndarray, what: str) -> np.ndarray:
        arr = _ids(ids, what)
        _check_base(arr, self.vocab_size, what)
        return arr

    def _discounts(self, counts: np.ndarray) -> tuple[float, float, float]:
        if self.discount is None:
            return _estimate_discounts(counts)
        return (float(self.discount),) * 3

    @property
    def discounts(self) -> dict[int, tuple[float, float, float]]:
        """{k: (D1, D2, D3+)} of the fitted model."""
        return {k: o.discounts for k, o in enumerate(self._orders, start=1)}

    def fit(self, ids: np.ndarray) -> "KneserNey":
        """Count the training ids (at least ``order`` of them). Returns self.

        Order K: c(g) for the unique K-grams U_K. Then for k = K-1 .. 1: the k-gram
        suffixes of U_{k+1}, with multiplicity, give N1+(. g); U_k is those suffixes plus
        the first k-gram of the text.
        """
        x = self._check(ids, "training ids")
        V, K = self.vocab_size, self.order
        if x.size < K:
            raise ReslmError(f"need at least {K} training ids for order {K}, got {x.size}")
        codes, counts = _unique(_packed(x, K, V))
        orders = [_Order(codes, counts, V, self._discounts(counts))]
        seen = codes  # U_{k+1}: all distinct (k+1)-grams of the text
        for k in range(K - 1, 0, -1):
            codes, counts = _unique(seen % V**k)
            orders.append(_Order(codes, counts, V, self._discounts(counts)))
            seen = _unique(np.r_[codes, _packed(x[:k], k, V)])[0]
        self._orders = orders[::-1]
        return self

    def _probs(self, windows: np.ndarray, avail: np.ndarray) -> np.ndarray:
        """p(last | history) for rows of windows (N, order): history = the avail (N,) ids
        before the last column (earlier columns are padding)."""
        if not self._orders:
            raise ReslmError("KneserNey model is not fitted; call fit first")
        V, K = self.vocab_size, self.order
        small = np.uint16 if V <= 1 << 16 else np.int64  # radix-sortable symbols
        p = np.full(windows.shape[0], 1.0 / V)
        code = np.zeros(windows.shape[0], dtype=np.int64)  # k-gram ending at the predicted id
        order = np.arange(windows.shape[0])  # rows sorted by code (LSD radix sort, one symbol
        for k, o in enumerate(self._orders, start=1):  # per order): cheaper than searchsorted
            col = windows[:, K - k]
            code += col.astype(np.int64) * V ** (k - 1)
            order = order[np.argsort(col[order].astype(small), kind="stable")]
            rows = order[avail[order] >= k - 1]
            hpos, hit = _lookup(o.hist, code[rows] // V)
            rows, hpos = rows[hit], hpos[hit]  # rows whose history order k has seen
            gpos, ghit = _lookup(o.codes, code[rows])
            p[rows] = np.where(ghit, o.own[gpos], 0.0) + o.gamma[hpos] * p[rows]
        return p

    def log_probs(self, ids: np.ndarray, start: int = 1) -> np.ndarray:
        """ln p(ids[t] | history) for t = start .. len(ids) - 1, shape (len(ids) - start,)."""
        y = self._check(ids, "ids")
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) \
                or not 0 <= start <= y.size:
            raise ReslmError(f"start must be in [0, {y.size}], got {start}")
        K = self.order
        padded = np.concatenate([np.zeros(K - 1, dtype=y.dtype), y])
        windows = np.lib.stride_tricks.sliding_window_view(padded, K)  # row t ends at y[t]
        out = np.empty(y.size - start)
        with np.errstate(divide="ignore"):  # a fixed discount of 0 can give p = 0: -inf
            for a in range(start, y.size, _CHUNK):
                b = min(a + _CHUNK, y.size)
                avail = np.minimum(np.arange(a, b), K - 1)
                out[a - start:b - start] = np.log(self._probs(windows[a:b], avail))
        return out

    def cross_entropy(self, ids: np.ndarray, start: int = 1) -> float:
        """Mean negative log-likelihood in nats per predicted id (positions start..)."""
        lp = self.log_probs(ids, start)
        if lp.size == 0:
            raise ReslmError("nothing to score: need more ids than start")
        return float(-lp.mean())

    def prob_table(self, history: np.ndarray | list[int]) -> np.ndarray:
        """p(w | history) for every w, shape (vocab_size,); only the last order - 1 ids count."""
        h = self._check(np.asarray(history, dtype=np.int64).reshape(-1), "history")
        h = h[max(h.size - (self.order - 1), 0):]
        windows = np.zeros((self.vocab_size, self.order), dtype=np.int64)
        windows[:, self.order - 1 - h.size:self.order - 1] = h
        windows[:, -1] = np.arange(self.vocab_size)
        return self._probs(windows, np.full(self.vocab_size, h.size))

    def sample(self, prompt: np.ndarray | list[int], length: int, seed: int = 0,
               temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None) -> np.ndarray:
        """Closed-loop generation: ``length`` ids, each drawn from prob_table of the ids so far.

        The draw is ``reslm.generate.pick`` on the log-probabilities, the sampler every model
        uses (temperature 0 = greedy; top-k / top-p filtering), with a torch.Generator seeded
        by ``seed``. Returns shape (length,), int64.
        """
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
            raise ReslmError(f"length must be a non-negative integer, got {length!r}")
        if not temperature >= 0:
            raise ReslmError(f"temperature must be >= 0, got {temperature}")
        gen = torch.Generator().manual_seed(int(seed))
        ids = [int(i) for i in np.asarray(prompt).reshape(-1)]
        out = np.empty(int(length), dtype=np.int64)
        with np.errstate(divide="ignore"):  # a fixed discount of 0 can give p = 0: -inf logit
            for t in range(int(length)):
                p = self.prob_table(ids[-(self.order - 1):] if self.order > 1 else [])
                out[t] = pick(torch.from_numpy(np.log(p)), temperature, top_k, top_p, gen)
                ids.append(int(out[t]))
        return out


def select_order(train_ids: np.ndarray, heldout_ids: np.ndarray, vocab_size: int,
                 orders: Iterable[int] = range(1, 11),
                 discount: float | None = None) -> tuple[int, dict[int, float]]:
    """Fit a KneserNey model of each order on train_ids and score it on heldout_ids.

    Returns (the order with the lowest held-out cross-entropy, {order: CE in nats}); ties
    go to the lower order. heldout_ids must be a held-out slice of the *training* data
    (e.g. the end of the last training shard, left out of train_ids), never the test
    shard: the test shard is for the final number only.
    """
    orders = sorted({int(k) for k in orders})
    if not orders:
        raise ReslmError("select_order needs at least one order")
    ce = {k: KneserNey(k, vocab_size, discount).fit(train_ids).cross_entropy(heldout_ids)
          for k in orders}
    return min(ce, key=lambda k: (ce[k], k)), ce
