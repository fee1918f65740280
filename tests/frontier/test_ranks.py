"""Quick against full by halves (issue 71): a configuration's half is fixed by its label, and each half's rho is
read from its own metric (A: validation, B: test)."""
from pathlib import Path

import pytest

from reslm.frontier import bench as fbench
from reslm.frontier.plan import load_plan
from reslm.frontier.ranks import HALVES_FROM, RECIPE_PLANS, _halves, half_of, spearman

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_the_half_is_the_labels_and_splits_the_substrate_plan_in_two():
    labels = [c.label or "base" for c in load_plan("substrate-ranks").configs]
    halves = [half_of(x) for x in labels]
    assert halves == [half_of(x) for x in labels]                    # the label alone decides
    assert 7 <= halves.count("A") <= 14 and halves.count("A") + halves.count("B") == len(labels)


def rows(n):
    # quick and full agree on validation, disagree on test in the reverse order
    return [dict(label=f"c{i}", quick=float(n - i), full=float(i), quick_val=float(i), full_val=float(i) * 2)
            for i in range(n)]


def test_half_a_is_ranked_by_validation_and_half_b_by_test():
    r = rows(12)
    text = _halves(r)[1]
    a = [x for x in r if half_of(x["label"]) == "A"]
    b = [x for x in r if half_of(x["label"]) == "B"]
    assert spearman([x["quick_val"] for x in a], [x["full_val"] for x in a]) == 1.0
    assert f"rho = 1.00 over {len(a)}" in text and f"rho = -1.00 over {len(b)}" in text
    assert all(x["label"] in text for x in r)


def test_the_largest_rank_moves_are_named_largest_first():
    from reslm.frontier.ranks import inversions
    r = [dict(label=x) for x in "abcd"]
    assert inversions(r, [1, 2, 3, 4], [1, 2, 3, 4]) == " Every configuration keeps its rank."
    text = inversions(r, [1, 2, 3, 4], [4, 2, 1, 3], most=2)
    assert text == " Largest rank moves: a (1 here, 4 at full), c (3 here, 1 at full)."


def test_too_few_configurations_give_no_halves():
    assert _halves(rows(HALVES_FROM - 1)) == []


def test_the_quick_recipe_is_chosen_on_half_a_alone_and_ties_go_to_the_cheaper(monkeypatch):
    from reslm.frontier import ranks
    plans = [load_plan(name) for name in ranks.RECIPE_PLANS]
    agree = {"substrate-ranks-lr3e-3": 1, "substrate-ranks-half": 1}    # the others rank half A backwards
    seconds = {"substrate-ranks-lr3e-3": 800.0, "substrate-ranks-half": 400.0}
    left_out = []

    def against(plan, table, index):
        out = []
        for i, c in enumerate(plan.configs):
            label = c.label or "base"
            if (plan.name, label) in left_out:
                continue
            sign = agree.get(plan.name, -1) if half_of(label) == "A" else 1
            out.append(dict(label=label, quick=float(-i), full=float(i), quick_val=float(sign * i), full_val=float(i),
                            seconds=seconds.get(plan.name, 600.0)))
        return out

    monkeypatch.setattr(ranks, "quick_against_full", against)
    tables = {p.name: [] for p in plans}
    rows, chosen = ranks.recipe_choice(plans, tables, {})
    assert chosen == "substrate-ranks-half"                                  # rho 1 twice: the cheaper one
    assert [r["rho_a"] for r in rows] == [-1.0, 1.0, 1.0]
    text = ranks.recipes_markdown(plans, tables, {})
    assert text.count("read for the chosen recipe only") == 2 and "**-1.00**" in text   # B read for the chosen alone
    assert f"runs: **{ranks.QUICK_PLAN}**" in text and "not yet the chosen substrate-ranks-half" in text
    first_a = next(c.label for c in plans[0].configs if half_of(c.label or "base") == "A")
    left_out.append((plans[0].name, first_a))                                # one half-A run missing: no choice
    assert ranks.recipe_choice(plans, tables, {})[1] is None
    assert "Chosen: none yet" in ranks.recipes_markdown(plans, tables, {})


@pytest.mark.parametrize("plan", RECIPE_PLANS)
def test_each_candidate_quick_recipe_trains_what_the_bench_would_run_with_it(plan):
    """A candidate plan's base is the bench's recipe (esn-lr's choice, published) with that plan's quick
    fields: what the plan measures of quick against full is what the bench's quick budget would do."""
    recipe, base = fbench.recipe_config("esn-lr", RESULTS), load_plan(plan).base
    assert (base.preset, base.model) == (recipe.preset, recipe.model)
    assert base.train == {**recipe.train, **fbench.quick_fields(plan)}
    assert fbench.QUICK == fbench.quick_fields(fbench.QUICK_PLAN) and fbench.QUICK_PLAN in RECIPE_PLANS


def test_the_quick_esn_reference_is_the_chosen_recipes_base():
    """esn-quick, the ESN a quick bench is printed beside, trains exactly the QUICK_PLAN's base (its seed 0
    is that plan's base run), at three seeds."""
    ref, base = load_plan("esn-quick"), load_plan(fbench.QUICK_PLAN).base
    assert ref.base.name(0) == base.name(0) and ref.base.run_config(1) == base.run_config(1)
    assert ref.rule.select == "none" and ref.rule.seeds == (0, 1, 2)
