"""Held-out loss during training: what a batch sampler's `evaluate` scores (reslm.train.batches).

* `TestShardLoss` (CharShards, the paper's metric): the cross-entropy, in nats and bits per
  character, of eval_samples test samples (`eval_slices`: 8 evenly spread blocks of the test shard,
  or all of it), or of final_eval_samples at the last evaluation (`final_samples`). Each test
  character is predicted from its `context` preceding characters read from a zero state; the test
  features are computed once per size and kept (the reservoir is fixed). A stream-mode model also
  gets the CE of its state carried through the test text.
* `window_loss` (TokenWindows): the mean CE over the sampler's fixed-seed val windows, in nats and
  bits per token.

Both read the test or val text only through their sampler, which never hands it to training.
"""
from __future__ import annotations

import torch

from reslm.core.metrics import (SPLIT_FIGURES, TEST_BPC, TEST_LOSS, TEST_STREAM_BPC, TEST_STREAM_LOSS, VAL_BITS_PER_TOKEN,
                                VAL_LOSS, bits)
from reslm.features import estimate_loss, eval_batch_size, feature_batches
from reslm.reservoir.physical import TEST_KEY, noise_stream


def eval_slices(n_tokens: int, context: int, eval_samples: int, blocks: int = 8) -> list[slice]:
    """Token slices of the test stream to evaluate on: all of it, or `blocks` evenly spread blocks
    holding `eval_samples` samples in total (each block brings its own `context` tokens)."""
    if eval_samples == 0 or eval_samples >= n_tokens - context:
        return [slice(0, n_tokens)]
    per = max(1, eval_samples // blocks)
    span = n_tokens - (per + context)
    return [slice(a, a + per + context) for a in (span * i // max(1, blocks - 1) for i in range(blocks))]


def final_samples(tc) -> int:
    """Test samples of the last evaluation (final_eval_samples; -1: the same as every other)."""
    n = tc.final_eval_samples
    return tc.eval_samples if n < 0 else n


class TestShardLoss:
    """The test CE of a CharShards source (its `evaluate`): the test shard's tokens through
    `source.tokens`, its features in the source's dtype and state cache (RUN/states: "test-" for
    eval_samples, "testfinal-" for a last evaluation of another size)."""

    def __init__(self, source):
        self.source, self._test = source, None

    def features(self, model, n: int, final: bool) -> list:
        """The test features of an evaluation of `n` samples (0: the whole shard), computed once."""
        src = self.source
        name = "test-" if not final or n == src.tc.eval_samples else "testfinal-"
        if self._test is not None and self._test[0] == name:
            return self._test[1]
        self._test = None   # free the other set first
        tokens, start = src.tokens(src.ds.test_shard), src.split.span(src.ds.test_shard)[0]
        feats_list = []
        for i, s in enumerate(eval_slices(tokens.numel(), src.context, n)):
            feats = src.cache.load(f"{name}{i}", src.dtype) if src.cache else None
            if feats is None:
                feats = model.features(tokens[s], position=start + s.start, progress=src.progress, **src.kw,
                                       **noise_stream(model, TEST_KEY, s.start))
                if src.cache:
                    src.cache.store(f"{name}{i}", feats)
            feats_list.append(feats)
        self._test = (name, feats_list)
        return feats_list

    def __call__(self, model, precision: str, final: bool = False) -> dict:
        """The test CE (nats, bits per character) on eval_samples test samples, or on
        final_eval_samples at the last evaluation (`final`)."""
        src = self.source
        n = final_samples(src.tc) if final else src.tc.eval_samples
        total, count = 0.0, 0
        for feats in self.features(model, n, final):
            batch = eval_batch_size(model, src.tc.batch_size, feats.targets.device, precision)
            loss, k = estimate_loss(model, feature_batches(feats, batch), precision=precision)
            total, count = total + loss * k, count + k
        loss = total / max(count, 1)
        row = {TEST_LOSS: loss, TEST_BPC: bits(loss)}
        if src.tc.final_eval_samples >= 0:   # evaluations of two sizes: say which this one is
            row["test_samples"] = count
        if src.layout == "streams":   # the state carried through the test text, beside the window CE:
            tokens = src.tokens(src.ds.test_shard)   # its first n + 1 tokens (n targets), or all of it
            stream, _ = model.stream_loss(tokens[:n + 1] if n else tokens)
            row.update({TEST_STREAM_LOSS: stream, TEST_STREAM_BPC: bits(stream)})
        return row


def window_loss(model, batches, precision: str) -> dict:
    """The mean CE over `batches` of token windows [(x, y), ...] (nats, bits per token): a
    TokenWindows source's val row."""
    loss, _ = estimate_loss(model, batches, precision=precision)
    return {VAL_LOSS: loss, VAL_BITS_PER_TOKEN: bits(loss)}


class HeldoutLoss:
    """The evaluation of a heldout_eval run (TrainConfig.heldout_eval): the CE on the held-out tails of
    a CharShards source's training shards (reslm.train.batches), never the test shard. The tails' features are computed at
    the first evaluation and kept (the reservoir is fixed).

    With `name` "val" (a run with a validation split, TrainConfig.val_fraction) the row is val_loss /
    val_bpc, scored on eval_samples evenly spaced positions of the split (0: all of them) at every
    evaluation, the last one included: keep_best_val compares like with like (final_eval_samples
    sizes only the test shard's last evaluation). The test CE follows it (`with_test`), unless the call
    says `test=False` (TrainConfig.test_every shard, at an evaluation that is not a shard's last)."""

    def __init__(self, source, name: str = "heldout", with_test: bool = False):
        self.source, self.feats, self.name, self.with_test = source, None, name, with_test
        self.eval_kind = source.eval_kind if with_test else name   # the summary's main figure

    def _batches(self, model, feats, samples: int, precision: str):
        batch = eval_batch_size(model, self.source.tc.batch_size, feats.targets.device, precision)
        if not samples or samples >= len(feats):
            return feature_batches(feats, batch)
        index = torch.linspace(0, len(feats) - 1, samples, device=feats.targets.device).long()
        return ((feats.batch(i), feats.targets[i]) for i in index.split(batch))

    def __call__(self, model, precision: str, final: bool = False, test: bool = True) -> dict:
        if self.feats is None:
            self.feats = [self.source.heldout_features(s) for s in self.source.heldout_shards()]
        tc = self.source.tc
        samples = 0 if self.name == "heldout" else tc.eval_samples   # the same positions every time
        per = -(-samples // len(self.feats)) if samples else 0
        total, count = 0.0, 0
        for feats in self.feats:
            loss, n = estimate_loss(model, self._batches(model, feats, per, precision), precision=precision)
            total, count = total + loss * n, count + n
        loss = total / max(count, 1)
        row = self.source.evaluate(model, precision, final) if self.with_test and test else {}
        loss_name, bpc_name = SPLIT_FIGURES[self.name]
        return {**row, loss_name: loss, bpc_name: bits(loss)}
