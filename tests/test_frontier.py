"""The reservoir frontier (issue 26): the rules as code, readout heads, EMA, the ceiling family, L-BFGS."""
import json

import pytest
import torch
import torch.nn as nn

from reslm.cli import main
from reslm.models import build_model, make_config, preset, preset_table
from reslm.models.budget import FRONTIER_BUDGET, check_frontier, check_frontier_config
from reslm.models.rc import RC


def test_presets_frontier_verdicts():
    rows = {r["name"]: r for r in preset_table()}
    assert rows["aerc-160-30"]["frontier"] and rows["aerc-160-30"]["trainable_params"] == FRONTIER_BUDGET == 155_459
    assert all(rows[n]["frontier"] for n in rows if n.startswith(("rc-", "aerc-")))
    assert not any(r["frontier"] for r in rows.values() if r["family"] == "tf")
    fam, over = preset("tf-64-4-4")
    v = check_frontier_config(fam, make_config(fam, **over))
    assert not v.ok and v.trainable_params == 15067 and "not a reservoir family" in v.reasons[0]


def test_frontier_budget_and_structure_rules():
    over = check_frontier_config("rc", make_config("rc", size=2700))      # 59 * 2701 > 155,459
    assert not over.ok and over.trainable_params == 59 * 2701 and "over the budget" in over.reasons[-1]
    m = build_model("rc", size=20, vocab_size=7)
    assert check_frontier(m).ok and check_frontier(m).trainable_params == 7 * 21
    m.reservoir.W_leak = nn.Parameter(torch.zeros(3))                    # a trained part of the substrate
    v = check_frontier(m)
    assert not v.ok and any("outside the readout head" in r for r in v.reasons)
    assert any("substrate has trainable" in r for r in v.reasons)

    class Peeks(RC):                                                     # a head that reads more than the state
        def forward_features(self, states, targets=None):
            return super().forward_features(states, targets)

    v = check_frontier(Peeks(make_config("rc", size=20, vocab_size=7)))
    assert not v.ok and "overridden (forward_features)" in v.reasons[0]


def test_presets_command_prints_the_verdict(capsys):
    assert main(["presets"]) == 0
    lines = {ln.split()[0]: ln.split() for ln in capsys.readouterr().out.splitlines()[1:]}
    assert lines["aerc-160-30"][-1] == "yes" and lines["tf-256-16-16"][-1] == "no"
    assert main(["presets", "--json"]) == 0
    assert all("frontier" in r for r in json.loads(capsys.readouterr().out))


CHAR_TRAIN = dict(batch_size=64, epochs_per_shard=1, epoch_samples=128, lr=3e-3, log_every=4, device="cpu",
                  precision="fp32")


@pytest.mark.parametrize("family,model,ok", [("rc", dict(size=24, streams=8), True),
                                             ("tf", dict(ff_dim=16, n_heads=2, n_layers=1), False)])
def test_summary_says_whether_the_run_qualifies(chars, tmp_path, family, model, ok):
    import reslm.train as tt
    summary = tt.train(tt.create_run(tmp_path / family, family, model, CHAR_TRAIN, chars), progress=False)
    assert summary["frontier"] is ok
