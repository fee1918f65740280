"""N-gram overlap / distinct-n and the Kneser-Ney baseline (reslm.ngram). Hermetic, fast."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reslm.core.errors import ReslmError
from reslm.ngram import (
    KneserNey,
    NgramReference,
    distinct_n,
    ngram_codes,
    overlap_n,
    select_order,
)


def markov_text(n: int, seed: int, vocab: int = 6) -> np.ndarray:
    """A noisy deterministic 2nd-order process: x_t = (x_{t-1} + 2 x_{t-2}) % vocab, 10% noise."""
    rng = np.random.default_rng(seed)
    x = np.zeros(n, dtype=np.uint8)
    x[:2] = rng.integers(vocab, size=2)
    noise = rng.random(n) < 0.1
    rand = rng.integers(vocab, size=n)
    for t in range(2, n):
        x[t] = rand[t] if noise[t] else (x[t - 1] + 2 * x[t - 2]) % vocab
    return x


# --- overlap / distinct ------------------------------------------------------------------


def test_overlap_counts_unique_ngrams():
    # G_2 = {ab, ba} (repeats once), R_2 = {ab, bc}: only "ab" is shared.
    assert overlap_n("abababab", "abc", 2) == 0.5
    assert overlap_n("abc", "abababab", 2) == 0.5  # G_2 = {ab, bc}
    assert overlap_n("abab", "xxabyy", 1) == 1.0
    assert overlap_n("abab", "xxayy", 1) == 0.5  # G_1 = {a, b}, only a in R_1
    assert overlap_n("hello", "hello world", 3) == 1.0
    assert overlap_n("zzzz", "abc", 2) == 0.0  # character absent from the reference


def test_overlap_edge_cases():
    assert math.isnan(overlap_n("ab", "abc", 3))  # G_3 empty: undefined
    assert math.isnan(distinct_n("ab", 3))
    assert overlap_n("abcd", "ab", 3) == 0.0  # R_3 empty, G_3 not
    assert overlap_n("ab", "", 1) == 0.0
    assert overlap_n(np.array([1, 2, 3]), np.array([1, 2]), 2, base=4) == 0.5
    with pytest.raises(ReslmError):
        overlap_n("abc", "abc", 0)
    with pytest.raises(ReslmError):
        overlap_n("abc", np.array([1, 2]), 1)  # str vs ids
    with pytest.raises(ReslmError):
        overlap_n(np.array([5]), np.array([1, 2]), 1, base=3)  # id >= base
    with pytest.raises(ReslmError):
        ngram_codes(np.array([1, 2]), 2.0)


def test_distinct_n():
    assert distinct_n("abababab", 2) == 2 / 7
    assert distinct_n("abcd", 2) == 1.0
    assert distinct_n("aaaa", 1) == 0.25
    assert distinct_n(np.array([3, 3, 4], dtype=np.uint16), 2) == 1.0


def test_ngram_codes_pack_exactly():
    ids = np.array([2, 0, 1, 2, 0, 1], dtype=np.uint8)
    assert ngram_codes(ids, 2, base=3).tolist() == [1, 5, 6]  # 01, 12, 20 in base 3
    assert ngram_codes(ids, 7).size == 0


def test_fallback_path_agrees_with_int64_path():
    rng = np.random.default_rng(0)
    gen, ref = rng.integers(0, 4, 3000), rng.integers(0, 4, 5000)
    for n in (2, 5, 8):
        fast = ngram_codes(gen, n, base=4)
        slow = ngram_codes(gen, n, base=2**40)  # 2**(40 n) >= 2**63: void rows
        assert fast.dtype == np.int64 and slow.dtype.kind == "V"
        assert fast.size == slow.size
        a, b = overlap_n(gen, ref, n, base=4), overlap_n(gen, ref, n, base=2**40)
        assert a == b and 0 < a <= 1
    assert a < 1  # n = 8: 65536 possible 8-grams, far from all in the reference
    # n large enough that even a small base leaves int64: 4**40 >= 2**63
    seq = np.tile(np.arange(4), 30)
    assert ngram_codes(seq, 40).dtype.kind == "V" and ngram_codes(seq, 40).size == 4
    assert overlap_n(seq, seq[3:], 40) == 1.0


def test_reference_cache_matches_overlap_n():
    rng = np.random.default_rng(1)
    ref = rng.integers(0, 5, 4000).astype(np.uint8)
    ref_obj = NgramReference(ref, base=6)
    for seed in range(3):
        gen = np.random.default_rng(seed + 10).integers(0, 6, 500)
        got = ref_obj.overlaps(gen, ns=(3, 4, 7))
        assert got == {n: overlap_n(gen, ref, n, base=6) for n in (3, 4, 7)}
    assert set(ref_obj._codes) == {3, 4, 7}  # built once each
    text = NgramReference("the cat sat on the mat")  # of th he "e " " h" ha at: not " h", ha
    assert text.overlap("the hat", 2) == overlap_n("the hat", "the cat sat on the mat", 2) == 4 / 6


def naive_overlap(gen, ref, n: int) -> float:
    """|G_n ∩ R_n| / |G_n| with plain Python sets of substrings (str) or id tuples."""
    def grams(x):
        x = x if isinstance(x, str) else tuple(int(i) for i in x)
        return {x[i:i + n] for i in range(len(x) - n + 1)}
    g, r = grams(gen), grams(ref)
    return len(g & r) / len(g) if g else float("nan")


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_overlap_keeps_unseen_characters_apart():
    # Unique bigrams of the generated text: ab, bx, xa, by; only ab is in the reference.
    assert overlap_n("abxaby", "abab", 2) == 0.25
    assert NgramReference("abab").overlaps("abxaby", ns=(1, 2)) == {1: 0.5, 2: 0.25}
    assert overlap_n("xyzw", "abab", 1) == 0.0 and overlap_n("xyxy", "abc", 2) == 0.0


@pytest.mark.parametrize("path", ["int64", "void"])
def test_overlap_matches_sets_of_substrings_on_text(path):
    rng = np.random.default_rng(7)
    if path == "int64":
        alphabet, ns = "abcdefgh", (1, 2, 3, 5)  # base 9: 9**5 fits int64
    else:
        alphabet, ns = "".join(chr(0x4E00 + i) for i in range(300)), (9, 12)  # 150**9 >= 2**63
    unseen = "XYZ!?"
    checked = void_rows = 0
    for trial in range(40):
        ref_alpha = alphabet[:rng.integers(2, 5)] if path == "int64" else alphabet
        ref = "".join(rng.choice(list(ref_alpha), rng.integers(0, 400) if path == "int64"
                                 else rng.integers(200, 600)))
        known = ref_alpha if path == "int64" else ref_alpha[:2]  # void: n-grams with unseen
        pool = list(known + unseen[:rng.integers(1, len(unseen) + 1)])  # characters in them
        gen = "".join(rng.choice(pool, rng.integers(0, 60)))
        if path == "void":  # reuse reference text so long n-grams do match
            start = int(rng.integers(0, len(ref)))
            gen = ref[start:start + 30] + gen
        ref_obj = NgramReference(ref)
        got = ref_obj.overlaps(gen, ns)
        for n in ns:
            want = naive_overlap(gen, ref, n)
            assert same(got[n], want), (ref, gen, n, got[n], want)
            assert same(overlap_n(gen, ref, n), want)
            checked += not math.isnan(want) and 0 < want < 1
        void_rows += ngram_codes(ref_obj.ids, ns[0], ref_obj.base).dtype.kind == "V"
    assert checked > 10  # the comparison was not vacuous
    assert (void_rows > 30) == (path == "void")


@pytest.mark.parametrize("base", [6, 2**40])  # int64 codes, void rows
def test_overlap_matches_sets_of_tuples_on_ids(base):
    rng = np.random.default_rng(8)
    for trial in range(30):
        ref = rng.integers(0, rng.integers(1, 4), rng.integers(0, 300))
        gen = rng.integers(0, 6, rng.integers(0, 50))
        ref_obj = NgramReference(ref, base=base)
        got = ref_obj.overlaps(gen, ns=(1, 2, 3, 4))
        for n in (1, 2, 3, 4):
            assert same(got[n], naive_overlap(gen, ref, n))


# --- Kneser-Ney ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus():
    return markov_text(20000, seed=0), markov_text(4000, seed=1)


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_kn_normalised(corpus, order):
    train = corpus[0][:3000]
    lm = KneserNey(order, vocab_size=8).fit(train)  # ids 6, 7 never occur in training
    rng = np.random.default_rng(order)
    histories = [train[100:100 + order - 1], train[:0], [7, 7, 6, 7], [0, 1], [6]]
    histories += [rng.integers(0, 8, rng.integers(0, 7)) for _ in range(10)]
    for h in histories:
        p = lm.prob_table(h)
        assert p.shape == (8,) and np.all(p > 0)
        assert abs(p.sum() - 1) < 1e-9


def test_kn_log_probs_match_prob_table(corpus):
    lm = KneserNey(3, 6).fit(corpus[0][:3000])
    y = corpus[1][:50]
    lp = lm.log_probs(y)
    assert lp.shape == (49,)
    for t in (1, 2, 10, 49):
        assert np.isclose(lp[t - 1], np.log(lm.prob_table(y[:t])[y[t]]))
    assert np.isclose(lm.log_probs(y, start=0)[0], np.log(lm.prob_table([])[y[0]]))


def naive_kn(train: list[int], order: int, vocab: int, discounts, history: list[int], w: int) -> float:
    """The interpolated modified-KN formula written out with dicts, one probability."""
    grams = {k: [tuple(train[i:i + k]) for i in range(len(train) - k + 1)] for k in range(1, order + 2)}

    def count(k, g):
        if k == order:
            return grams[k].count(g)
        return len({a[0] for a in set(grams[k + 1]) if a[1:] == g})  # N1+(. g)

    def p(k, h):
        if k == 0:
            return 1 / vocab
        h = h[len(h) - (k - 1):] if k > 1 else ()
        counts = {v: count(k, h + (v,)) for v in range(vocab)}
        total = sum(counts.values())
        if total == 0:
            return p(k - 1, h)
        d = lambda c: 0.0 if c == 0 else discounts[k][min(c, 3) - 1]
        gamma = sum(d(c) for c in counts.values()) / total
        return (counts[w] - d(counts[w])) / total + gamma * p(k - 1, h)

    return p(order, tuple(history))


def test_kn_matches_naive_formula(corpus):
    train = corpus[0][:400]
    for order in (1, 2, 4):
        lm = KneserNey(order, 7).fit(train)
        rng = np.random.default_rng(order)
        for _ in range(4):
            h = rng.integers(0, 7, order - 1).tolist() if rng.random() < 0.5 else \
                train[50:50 + order - 1].tolist()
            p = lm.prob_table(h)
            for w in (0, 3, 6):
                assert np.isclose(p[w], naive_kn(train.tolist(), order, 7, lm.discounts, h, w))


def test_kn_higher_order_wins_and_select_order(corpus):
    train, held = corpus
    ce1 = KneserNey(1, 6).fit(train).cross_entropy(held)
    ce3 = KneserNey(3, 6).fit(train).cross_entropy(held)
    assert ce3 < ce1 - 0.5
    best, ces = select_order(train, held, 6, orders=range(1, 6))
    assert best > 1 and set(ces) == {1, 2, 3, 4, 5} and ces[best] == min(ces.values())


def test_kn_unigram_closed_form():
    train = np.array([0, 0, 0, 1, 1, 2, 0, 1], dtype=np.uint8)
    c = np.bincount(train, minlength=4)  # [4, 3, 1, 0]
    ml = KneserNey(1, 4, discount=0.0).fit(train)
    assert np.allclose(ml.prob_table([]), c / c.sum())  # no discount: maximum likelihood
    lm = KneserNey(1, 4, discount=0.5).fit(train)
    expected = (np.maximum(c - 0.5, 0) + 0.5 * 3 / 4) / c.sum()  # 3 seen symbols share 0.5 each
    assert np.allclose(lm.prob_table([2, 1]), expected)
    assert np.isclose(lm.cross_entropy(train), -np.log(expected[train[1:]]).mean())


def test_kn_bad_input():
    with pytest.raises(ReslmError):
        KneserNey(0, 5)
    with pytest.raises(ReslmError):
        KneserNey(11, 59)  # 59**11 > 2**63
    KneserNey(10, 59)  # 59**10 fits
    with pytest.raises(ReslmError):
        KneserNey(2, 3).fit(np.array([0, 1, 3]))  # id >= vocab_size
    with pytest.raises(ReslmError):
        KneserNey(2, 3).fit(np.array([0, 1, -1]))
    with pytest.raises(ReslmError):
        KneserNey(2, 3).cross_entropy(np.array([0, 1]))  # not fitted
    with pytest.raises(ReslmError):
        KneserNey(2, 3).fit(np.array([0, 1, 2])).cross_entropy(np.array([0, 5]))
    with pytest.raises(ReslmError):
        KneserNey(3, 3).fit(np.array([0, 1]))  # shorter than the order
    with pytest.raises(ReslmError):
        KneserNey(2, 3, discount=1.5)
    with pytest.raises(ReslmError):
        KneserNey(2, 3).fit(np.array([0, 1, 2])).cross_entropy(np.array([0, 1]), start=2)


def test_kn_sample_greedy_and_seeded(corpus):
    lm = KneserNey(3, 6).fit(corpus[0][:3000])
    prompt = corpus[1][:10]
    greedy = lm.sample(prompt, 40, seed=0, temperature=0)
    assert greedy.shape == (40,) and greedy.dtype == np.int64
    assert np.array_equal(greedy, lm.sample(prompt, 40, seed=123, temperature=0.0))  # no randomness
    ids = list(prompt)
    for t in range(40):  # greedy = the most probable next id each time
        assert greedy[t] == np.argmax(lm.prob_table(ids[-2:]))
        ids.append(int(greedy[t]))
    assert np.array_equal(lm.sample(prompt, 40, top_k=1), greedy)
    a, b = lm.sample(prompt, 200, seed=5), lm.sample(prompt, 200, seed=5)
    assert np.array_equal(a, b)  # same seed, same sample
    assert not np.array_equal(a, lm.sample(prompt, 200, seed=6))
    assert lm.sample([], 5, seed=1).shape == (5,) and lm.sample(prompt, 0).shape == (0,)
    with pytest.raises(ReslmError):
        lm.sample(prompt, 5, temperature=-1)


def test_kn_sample_avoids_zero_probability_ids():
    # discount 0: p(w | h) = 0 for unseen continuations (log p = -inf) and they are never drawn
    lm = KneserNey(2, 4, discount=0.0).fit(np.array([0, 1, 0, 1, 0, 2, 0, 1], dtype=np.uint8))
    out = lm.sample([0], 300, seed=3, temperature=1.5)
    assert set(out.tolist()) <= {0, 1, 2} and 3 not in out
    follows = {0: {1, 2}, 1: {0}, 2: {0}}
    seq = [0] + out.tolist()
    assert all(b in follows[a] for a, b in zip(seq, seq[1:]))
