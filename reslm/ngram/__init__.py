"""N-grams of token ids: the overlap metrics of generated text (overlap.py) and the Kneser-Ney
baseline (kneser_ney.py), both on exact int64 n-gram codes (codes.py).

Everything works on 1-D integer id arrays (uint8/uint16/int64, ids in ``[0, base)``); the
overlap and distinct functions also take ``str`` (characters, compared by code point).
"""
from reslm.ngram.codes import ngram_codes
from reslm.ngram.kneser_ney import KneserNey, select_order
from reslm.ngram.overlap import NgramReference, distinct_n, overlap_n

__all__ = ["KneserNey", "NgramReference", "distinct_n", "ngram_codes", "overlap_n", "select_order"]
