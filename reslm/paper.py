"""The paper's published figures, stored once: every command and report that quotes the paper reads them here.

Köster & Uchida, *Reservoir Computing as a Language Model*: the test cross-entropies (nats per character)
of the largest model of each character family (Table 1 / Fig. 2), the slopes a of the scaling law
L_min = a log10 N + b fitted to the token-level transformers (a_TF) and LAERC models (a_Res), and the
character training protocol (PROTOCOL: TrainConfig's defaults).
Nothing here is measured by reslm.
"""
from __future__ import annotations

TEST_CE = {"tf": 1.67, "aerc": 1.73, "rc": 1.81}     # largest model of each family, nats per character
LARGEST = {"tf": "tf-256-16-16", "aerc": "aerc-160-30", "rc": "rc-2600"}   # the preset each figure is of
SLOPES = {"a_TF": -1.72, "a_Res": -0.81}              # L_min = a log10 N + b, transformer / LAERC
# The paper's character training protocol (Section 3): TrainConfig's defaults (reslm.settings) and what a
# run must have trained with to sit in the paper-protocol table (reslm.report.rows)
PROTOCOL = dict(optimizer="adam", lr=1e-4, schedule="constant", batch_size=1024, epochs_per_shard=5, cycles=1,
                epoch_samples=0, shard_chars=0)


def _short(x: float) -> str:
    """1e-4 -> "1e-4", 7.5e-4 -> "7.5e-4": a learning rate as the paper writes it."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


# the same, in words (the --help of reproduce and lab), derived so that the two cannot disagree
PROTOCOL_TEXT = (f"{PROTOCOL['epochs_per_shard']} epochs on each full shard, batch {PROTOCOL['batch_size']}, "
                 f"{PROTOCOL['optimizer'].capitalize()} {_short(PROTOCOL['lr'])}")
PAPER = {"test_ce": TEST_CE, "a_TF": SLOPES["a_TF"], "a_Res": SLOPES["a_Res"]}   # as results.json quotes it
