"""The paper's published figures, stored once: every command and report that quotes the paper reads them here.

Köster & Uchida, *Reservoir Computing as a Language Model*: the test cross-entropies (nats per character)
of the largest model of each character family (Table 1 / Fig. 2), and the slopes a of the scaling law
L_min = a log10 N + b fitted to the token-level transformers (a_TF) and LAERC models (a_Res).
Nothing here is measured by reslm.
"""
from __future__ import annotations

TEST_CE = {"tf": 1.67, "aerc": 1.73, "rc": 1.81}     # largest model of each family, nats per character
LARGEST = {"tf": "tf-256-16-16", "aerc": "aerc-160-30", "rc": "rc-2600"}   # the preset each figure is of
SLOPES = {"a_TF": -1.72, "a_Res": -0.81}              # L_min = a log10 N + b, transformer / LAERC
PAPER = {"test_ce": TEST_CE, "a_TF": SLOPES["a_TF"], "a_Res": SLOPES["a_Res"]}   # as results.json quotes it
