"""The esn-longmem plan (issue 70): it loads under the strict rules, its base is esn-substrates' chosen
lr2250-r32 configuration (the same fingerprint, so its published seeds are found and never retrained), and
every candidate keeps the base's 2,250 state values and trainable count."""
import pytest

from reslm.frontier import load_plan
from reslm.models import check_frontier_config, make_config
from reslm.reservoir import RESERVOIRS


@pytest.fixture(scope="module")
def plan():
    return load_plan("esn-longmem")


def test_the_base_is_the_chosen_strict_configuration(plan):
    chosen = next(c for c in load_plan("esn-substrates").candidates if c.label == "lr2250-r32")
    assert plan.base.fingerprint == chosen.fingerprint
    assert (plan.rule.select, plan.rule.screen_seed, list(plan.rule.seeds), plan.rule.strict) == ("screen", 0, [0, 1, 2], True)
    assert plan.base.train["val_split"] == "groups"


def test_every_candidate_is_strict_at_the_base_budget(plan):
    labels = [c.label for c in plan.candidates]
    assert labels == ["es2n-b0.3", "es2n-b0.1", "esn-lmu64", "esn-lmu256", "esn-diag4-512"]
    for c in plan.configs:
        cfg = make_config(c.family, **c.model)
        verdict = check_frontier_config(c.family, cfg)
        assert verdict.ok and verdict.trainable_params == 153_779, (c.label, verdict)
        assert cfg.size == 2250 and cfg.head_rank == 32 and cfg.head_hidden == 180
        res = cfg.reservoir_config()
        if cfg.reservoir == "composite":
            assert res.part_sizes() == [1482, 768]
            esn, memory = res.part_configs()
            assert (esn.spectral_radius, esn.input_scaling, esn.input_init) == (1.1111, 1.1111, "normal")
            assert type(memory) is RESERVOIRS["legendre" if "lmu" in c.label else "diagonal"][0]


def test_the_quick_screen_trains_the_same_models_at_the_quick_budget(plan):
    quick = load_plan("esn-longmem-quick")
    assert [c.label for c in quick.configs] == [f"{c.label}-quick" for c in plan.configs]
    for q, full in zip(quick.configs, plan.configs):
        assert q.model == full.model
        assert (q.train["epochs_per_shard"], q.train["cycles"], q.full) == (1, 1, {"epochs_per_shard": 5, "cycles": 2})
    assert quick.rule.select == "none" and list(quick.rule.seeds) == [0]
