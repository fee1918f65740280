"""eval_at (issue 88): a long run's later cycles scored after each shard, not each shard-epoch. A record
field: the same weights, the same run identity, a fifth of the later evaluations."""
import pytest
import torch

import reslm.train as tt
from reslm.core.errors import ReslmError
from reslm.models.identity import fingerprint
from reslm.run import read_config, read_metrics
from reslm.settings import TrainConfig, evaluations

TRAIN = dict(batch_size=64, epochs_per_shard=2, cycles=2, epoch_samples=128, lr=3e-3, log_every=1, device="cpu",
             precision="fp32", window_step="plain")


def test_eval_at_is_checked_and_counted():
    with pytest.raises(ReslmError, match="eval_at must be one of"):
        TrainConfig(eval_at="sometimes").validate()
    with pytest.raises(ReslmError, match="keep_best_val needs eval_at shard-epoch"):
        TrainConfig(eval_at="shard-after-cycle-1", val_fraction=0.1, keep_best_val=True).validate()
    assert evaluations(dict(cycles=3, epochs_per_shard=5), 5) == 75
    assert evaluations(dict(cycles=3, epochs_per_shard=5, eval_at="shard-after-cycle-1"), 5) == 25 + 5 + 5


def test_a_run_scored_after_each_later_shard_trains_the_same_weights(chars, tmp_path):
    from reslm.frontier.runner import figures

    runs = {}
    for eval_at in ("shard-epoch", "shard-after-cycle-1"):
        run = tt.create_run(tmp_path / eval_at, "tf", dict(ff_dim=16, n_heads=2, n_layers=1),
                            {**TRAIN, "eval_at": eval_at}, chars)
        tt.train(run, progress=False)
        runs[eval_at] = run
    every, later = (read_metrics(runs[k], "eval") for k in ("shard-epoch", "shard-after-cycle-1"))
    assert [(e["cycle"], e["epoch"]) for e in later] == [(0, e) for _ in range(5) for e in (0, 1)] + [(1, 1)] * 5
    assert later[:10] == [{**e, "wall": l["wall"], "seconds": l["seconds"], "eval_seconds": l["eval_seconds"],
                           "samples_per_s": l["samples_per_s"]} for e, l in zip(every[:10], later[:10])]
    assert [e["test_loss"] for e in later[10:]] == [e["test_loss"] for e in every[10:] if e["epoch"] == 1]
    a, b = (torch.load(runs[k] / "checkpoint.pt", weights_only=True)["model"] for k in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert fingerprint(read_config(runs["shard-epoch"])) == fingerprint(read_config(runs["shard-after-cycle-1"]))
    got = figures(runs["shard-after-cycle-1"])
    assert got["progress"] == 1.0 and got["epochs_left"] == 0
