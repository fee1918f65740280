"""The figures a run writes, each name declared once, with its unit.

Writers build their records with these names (reslm.train.evaluation, reslm.train.loop, reslm.scoring.evaluate)
and readers look them up by the same names (reslm.report, reslm.scoring.verify, reslm.frontier,
reslm.experiments); tests/core/test_metrics.py keeps the names' literals out of the rest of the
package. A run's figures live in three places:

* metrics.jsonl, one row per logged step or evaluation: TRAIN_LOSS and the held-out figures below;
* summary.json, a figure at one point of the run: `final_of(name)` (the last evaluation's), `best_of(name)`
  (the lowest over the evaluations), `kept_of(name)` (the kept best-on-validation weights', scored again
  at the end), MIN_TRAIN_LOSS and TEST_LOSS_AT_BEST_VAL;
* eval.json (`reslm eval`): TEST_LOSS, TEST_BITS and TEST_BPC; a manifest's check: CHECK_LOSS.

Losses are natural-log cross-entropies per predicted target (a character or a token); `bits` turns
one into bits per target.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

LN2 = math.log(2)


def bits(nats: float) -> float:
    """Nats per symbol -> bits per symbol (bits per character for a character model)."""
    return nats / LN2


@dataclass(frozen=True)
class Figure:
    """One figure a run writes: its key in the JSON files, its unit and what it measures."""
    name: str
    unit: str
    about: str


FIGURES: dict[str, Figure] = {}


def _figure(name: str, unit: str, about: str) -> str:
    FIGURES[name] = Figure(name, unit, about)
    return name


TRAIN_LOSS = _figure("train_loss", "nats/target", "training cross-entropy, mean over the steps since the last record")
LBFGS_TRAIN_LOSS = _figure("lbfgs_train_loss", "nats/target", "training cross-entropy of the L-BFGS readout")
TEST_LOSS = _figure("test_loss", "nats/target",
                    "test cross-entropy, each target from its context read from a zero state (the paper's metric)")
TEST_BPC = _figure("test_bpc", "bits/char", "the test cross-entropy in bits per character of text")
TEST_BITS = _figure("test_bits", "bits/target", "the test cross-entropy in bits per target (token or character)")
TEST_STREAM_LOSS = _figure("test_stream_loss", "nats/target",
                           "test cross-entropy with the state carried through the test text (stream-mode models)")
TEST_STREAM_BPC = _figure("test_stream_bpc", "bits/char", "the carried-state test cross-entropy in bits per character")
VAL_LOSS = _figure("val_loss", "nats/target", "cross-entropy on the validation split carved from the training text")
VAL_BPC = _figure("val_bpc", "bits/char", "the validation cross-entropy in bits per character")
VAL_BITS_PER_TOKEN = _figure("val_bits_per_token", "bits/token", "the validation cross-entropy in bits per token")
HELDOUT_LOSS = _figure("heldout_loss", "nats/target", "cross-entropy on held-out tails of the training shards")
HELDOUT_BPC = _figure("heldout_bpc", "bits/char", "the held-out tails' cross-entropy in bits per character")
MEMORY_LOSS = _figure("memory_loss", "nats/target", "cross-entropy of targets (of the text `split` names: test, val "
                      "or train) each predicted from exactly k symbols before it, read from a zero state, by k "
                      "(reslm memory)")
CHECK_LOSS = _figure("loss", "nats/target", "a manifest check's test cross-entropy on its recorded positions")

# A held-out text's loss and bits per character, by its name (a batch sampler's eval_kind, HeldoutLoss's
# name); a token run's validation row is VAL_LOSS and VAL_BITS_PER_TOKEN (reslm.train.evaluation.window_loss)
SPLIT_FIGURES = {"test": (TEST_LOSS, TEST_BPC), "val": (VAL_LOSS, VAL_BPC), "heldout": (HELDOUT_LOSS, HELDOUT_BPC)}


def final_of(name: str) -> str:
    """summary.json's key of a figure at the run's last evaluation."""
    return "final_" + name


def best_of(name: str) -> str:
    """summary.json's key of a figure's lowest value over the run's evaluations."""
    return "best_" + name


def kept_of(name: str) -> str:
    """summary.json's key of a figure of the kept weights (keep_best_val), scored again at the end."""
    return "weights_" + name


MIN_TRAIN_LOSS = "min_" + TRAIN_LOSS                # the lowest training CE of any record
TEST_LOSS_AT_BEST_VAL = TEST_LOSS + "_at_best_val"  # the test CE at the best validation evaluation


def summary_names() -> set[str]:
    """Every summary.json key this module names: each figure at its points of the run."""
    points = {point(f) for f in FIGURES if f != CHECK_LOSS for point in (final_of, best_of, kept_of)}
    return points | {MIN_TRAIN_LOSS, TEST_LOSS_AT_BEST_VAL}
