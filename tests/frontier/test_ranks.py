"""Quick against full by halves (issue 71): a configuration's half is fixed by its label, and each half's rho is
read from its own metric (A: validation, B: test)."""
from reslm.frontier.plan import load_plan
from reslm.frontier.ranks import HALVES_FROM, _halves, half_of, spearman


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


def test_too_few_configurations_give_no_halves():
    assert _halves(rows(HALVES_FROM - 1)) == []
