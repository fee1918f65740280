"""What identifies a run (reslm.models.identity): roles, deltas, fingerprints, names and the command."""
import shlex

import pytest

from reslm.cli.parsers import build_parser
from reslm.core.errors import ReslmError
from reslm.models.identity import (command, delta, describe, fingerprint, identity, name_problem, recipe, run_name,
                                   same_run_problem)
from reslm.settings import ROLES, field_roles


def cfg(model=None, train=None, preset="rc-750", seed=0, data="shakespeare"):
    r = recipe(preset=preset, model=model, train=train, data=data)
    r["model"]["seed"] = r["train"]["seed"] = seed
    r["model"]["vocab_size"] = 59
    return r


def test_every_training_field_has_a_role():
    roles = field_roles()
    assert set(roles.values()) <= set(ROLES)
    assert {k for k, v in roles.items() if v != "identity"} == {"seed", "threads", "device", "precision", "compile", "window_step",
                                                                   "log_every", "test_every", "eval_at"}


def test_where_and_how_often_a_run_logs_do_not_make_it_another_configuration():
    a = cfg(train=dict(lr=3e-3))
    b = cfg(train=dict(lr=3e-3, threads=2, device="cpu", log_every=7))
    assert fingerprint(a) == fingerprint(b) and same_run_problem(a, b) is None
    assert fingerprint(cfg(train=dict(lr=1e-3))) != fingerprint(a)


def test_one_configuration_at_two_seeds_shares_its_fingerprint_not_its_name():
    a, b = cfg(seed=0), cfg(seed=1)
    assert fingerprint(a) == fingerprint(b)
    assert run_name(a) != run_name(b) and run_name(b).endswith("-s1")
    assert same_run_problem(a, b) == "a different model"


def test_a_field_added_since_reads_as_its_default():
    new = cfg(train=dict(val_fraction=0.05))
    old = {**new, "train": {k: v for k, v in new["train"].items() if k != "val_split"}}   # predates val_split
    assert fingerprint(old) == fingerprint(new) and delta(old) == delta(new)


def test_delta_from_the_paper_and_from_a_recipe():
    c = cfg(model=dict(head="mlp3", head_hidden=141), train=dict(lr=7.5e-4, cycles=2))
    assert delta(c) == {"model": {"head": "mlp3", "head_hidden": 141}, "train": {"lr": 7.5e-4, "cycles": 2}}
    base = recipe(preset="rc-750", model=dict(head="mlp3", head_hidden=141), train=dict(lr=3e-3, cycles=2))
    assert delta(c, base) == {"model": {}, "train": {"lr": 7.5e-4}}
    assert describe(delta(c, base)) == ["lr=0.00075"]
    with pytest.raises(ReslmError, match="no delta"):
        delta(c, recipe("tf"))


def test_names_are_derived_and_checked():
    c = cfg(train=dict(lr=1.5e-3))
    name = run_name(c, "lr1.5e-3")
    assert name.startswith("rc-750-lr1.5e-3-") and name == run_name(c, "lr1.5e-3")
    assert name_problem(name, c) is None
    assert "fingerprint" in name_problem(name, cfg(train=dict(lr=3e-3)))
    assert "seed" in name_problem(name, cfg(train=dict(lr=1.5e-3), seed=2))
    assert run_name(cfg(model=dict(size=1500))).startswith("rc-")   # grown past its preset: the family's stem
    assert not run_name(cfg(model=dict(size=1500))).startswith("rc-750")
    with pytest.raises(ReslmError, match="label"):
        run_name(c, "a/b")


@pytest.mark.parametrize("name, changes, problem", [
    ("rc-750-mlp3-141-authors-cos7.5e-4-2c-ema0.9999-gval-s0", {}, None),
    ("rc-750-mlp3-141-authors-cos7.5e-4-2c-ema0.9999-gval-s1", {}, "seed"),
    ("rc-750-mlp3-141-authors-cos3e-3-2c-ema0.9999-gval-s0", {}, "cos3e-3"),
    ("rc-750-mlp3-141-authors-cos7.5e-4-3c-ema0.9999-gval-s0", {}, "3c"),
    ("rc-750-mlp3-141-authors-cos7.5e-4-2c-ema0.999-gval-s0", {}, "ema0.999"),
    ("rc-750-mlp2-141-authors-cos7.5e-4-2c-ema0.9999-gval-s0", {}, "mlp2-141"),
    ("rc-750-mlp3-141-authors-cos7.5e-4-2c-ema0.9999-val-s0", {}, "val"),
    ("rc-750-stream", dict(context_mode="window"), "stream"),
    ("rc-500-mlp3-141", {}, "rc-500"),
])
def test_older_names_are_checked_word_by_word(name, changes, problem):
    c = cfg(model={**dict(head="mlp3", head_hidden=141, context_mode="stream"), **changes},
            train=dict(lr=7.5e-4, schedule="cosine", cycles=2, ema=0.9999, val_fraction=0.05, val_split="groups"))
    found = name_problem(name, c)
    assert (found is None) if problem is None else (problem in found)


def test_the_command_makes_the_same_configuration():
    c = cfg(model=dict(head="mlp3", head_hidden=141, reservoir_options="input_init=normal"),
            train=dict(lr=7.5e-4, keep_best_val=True, val_fraction=0.05, threads=1), seed=3)
    line = command(c, out="runs/x", extra={"threads": 1})
    assert line.count("--threads") == 1 and "--seed 3" in line
    argv = shlex.split(line)[1:]
    args = build_parser(argv).parse_args(argv)
    model = {k: getattr(args, k) for k in args._model_fields if getattr(args, k) is not None}
    train = {k: getattr(args, k) for k in args._train_fields if getattr(args, k) is not None}
    rebuilt = recipe(preset=args.preset, model=model, train={**train, "seed": args.seed}, data=args.data)
    rebuilt["model"]["seed"] = args.seed
    assert identity(rebuilt) == identity(c) and fingerprint(rebuilt) == fingerprint(c)
