"""The evaluations a sampler scores (reslm.train.evaluation): the test shard's blocks, the sizes of
the last evaluation, the window CE."""
import math
from types import SimpleNamespace

import pytest
import torch

from reslm.train.evaluation import eval_slices, final_samples, window_loss


def test_eval_slices_spread_blocks_over_the_test_stream_or_take_it_whole():
    assert eval_slices(1000, 32, 0) == [slice(0, 1000)]
    assert eval_slices(1000, 32, 968) == [slice(0, 1000)]
    blocks = eval_slices(1000, 32, 80)
    assert len(blocks) == 8 and all(s.stop - s.start == 10 + 32 for s in blocks)
    assert blocks[0].start == 0 and blocks[-1].stop == 1000


def test_final_samples_default_to_every_evaluations():
    assert final_samples(SimpleNamespace(eval_samples=100, final_eval_samples=-1)) == 100
    assert final_samples(SimpleNamespace(eval_samples=100, final_eval_samples=0)) == 0


def test_window_loss_is_the_val_row_in_nats_and_bits_per_token():
    class Uniform(torch.nn.Module):
        def forward_features(self, x, y):
            return torch.zeros(*x.shape, 4), None
    x = torch.zeros(2, 3, dtype=torch.long)
    row = window_loss(Uniform(), [(x, x), (x, x)], "fp32")
    assert row["val_loss"] == pytest.approx(math.log(4))
    assert row["val_bits_per_token"] == pytest.approx(2.0)
