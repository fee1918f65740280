"""Every split in one module (reslm.data.splits): group runs, the closest boundary, the token val
split, the streamed split, a run's held-out tails and file groups."""
from types import SimpleNamespace

import pytest

from reslm.core.errors import ReslmError
from reslm.data import splits


def test_group_runs_and_the_file_groups_a_meta_json_records():
    assert splits.group_runs(["a", "a", "b", "a", "c", "c"]) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert splits.group_runs([]) == []
    files = [dict(group="x", start=0, end=5), dict(group="x", start=5, end=9), dict(group="y", start=9, end=20)]
    meta = {"source": {"files": files}}
    assert splits.file_groups(meta) == [("x", 0, 9), ("y", 9, 20)]
    assert splits.file_groups(meta, within=(7, 12)) == [("x", 7, 9), ("y", 9, 12)]
    assert splits.file_groups(meta, within=(9, 12)) == [("y", 9, 12)]
    assert splits.file_groups({"source": {"files": [dict(group="x", end=3)]}}) == []   # no offsets: none
    assert splits.closest([10, 30], 20) == 10 and splits.closest([(10, 1), (29, 2)], 20, key=lambda c: c[0]) == (29, 2)


class Doc:
    def __init__(self, text, group):
        self._text, self.group, self.n_chars = text, group, len(text)

    def text(self):
        return self._text


def test_token_split_snaps_to_a_group_or_to_a_safe_newline():
    docs = [Doc("a" * 50, "p"), Doc("b" * 30, "p"), Doc("c" * 20, "q")]
    split = splits.plan_token_split(docs, 0.3, snap_to_groups=True)
    assert (split["doc"], split["offset"], split["boundary_char"]) == (2, 0, 80)
    with pytest.raises(ReslmError, match="only one group"):
        splits.plan_token_split(docs[:2], 0.3, snap_to_groups=True)
    text = "one line\ntwo line\n three\nfour\n"
    split = splits.plan_token_split([Doc(text, "f")], 0.2, snap_to_groups=False)
    assert split["boundary_char"] == split["offset"] == text.index("two")   # not before " three": a space follows
    every, is_val = splits.every_kth(0.25)
    assert every == 4 and [i for i in range(12) if is_val(i)] == [3, 7, 11]


def _dataset(shards, ends=()):
    return SimpleNamespace(name="d", shards=shards, train_shards=list(range(len(shards) - 1)),
                           test_shard=len(shards) - 1, group_ends=lambda: list(ends))


def test_a_runs_tails_and_held_out_groups():
    ds = _dataset([[0, 100], [100, 200], [200, 260]], ends=[40, 150, 190, 260])
    tails = splits.ShardSplit(ds, context=8, holdout=0.25)
    assert [tails.span(s) for s in range(3)] == [(0, 75), (100, 175), (200, 260)]
    assert tails.span(1, "heldout") == (167, 200) and tails.heldout_shards() == [0, 1]
    short = splits.ShardSplit(ds, context=8, holdout=0.5, shard_chars=40)
    assert short.span(0) == (0, 20) and short.span(0, "heldout") == (12, 40)
    assert splits.val_groups_cut(ds, 0.25, 8) == 150
    groups = splits.ShardSplit(ds, context=8, holdout=0.25, groups=True)
    assert groups.val_cut == 150 and groups.span(0) == (0, 100) and groups.span(1) == (100, 150)
    assert groups.span(1, "heldout") == (142, 200) and groups.heldout_shards() == [1]
    # shard_chars with groups cuts the training parts alone: the held-out groups stay whole
    cut = splits.ShardSplit(ds, context=8, holdout=0.25, shard_chars=30, groups=True)
    assert cut.span(0) == (0, 30) and cut.span(1) == (100, 130) and cut.span(2) == (200, 260)
    assert cut.span(1, "heldout") == groups.span(1, "heldout") and cut.heldout_shards() == [1]
    splits.check_tails(ds, 0.25, 8)
    with pytest.raises(ReslmError, match="val_fraction 0.95 of a 100-character"):
        splits.check_tails(ds, 0.95, 8, name="val_fraction")
    with pytest.raises(ReslmError, match="records its files' groups"):
        splits.val_groups_cut(_dataset(ds.shards), 0.25, 8)
