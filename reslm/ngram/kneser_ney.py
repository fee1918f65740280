"""The Kneser-Ney baseline: an interpolated *modified* Kneser-Ney n-gram model over ids (Chen &
Goodman 1998), see ``KneserNey``; ``select_order`` picks its order on held-out training text.

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
from reslm.ngram.codes import _INT64_LIMIT, _check_base, _ids, _lookup, _packed, _unique

_MIN_DISCOUNT = 0.1  # floor of an estimated discount: keeps every gamma(h) > 0
_CHUNK = 1 << 20  # positions scored at once by KneserNey (bounds evaluation memory)


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
