"""Where each part of a text goes: every split reslm carves, in one module.

A dataset is split once, when it is written:

* characters (reslm.data.chars): `plan_shards`, n_shards contiguous shards, the last the test shard,
  its start snapped to the file-group boundary closest to (n_shards - 1) / n_shards of the text; or
  (`reslm data ... --split authors`) `plan_authors_split`, the split of the authors' own scripts: one
  training shard, the first int(0.9 n) characters, and the rest as the test shard, cut where it falls;
* BPE tokens (reslm.data.bpe): `plan_token_split`, the val view is the last val_fraction of the
  characters, snapped to a group boundary (Shakespeare) or moved back to a safe newline (files);
* a streamed corpus (reslm.data.hf): `every_kth`, every k-th document is validation.

A character run splits its training shards again (reslm.train's samplers, `reslm search`):

* tails: the last `fraction` of each training shard is held out (`tail_start`, `check_tails`);
* whole file groups: the text from `val_groups_cut` (a group boundary near the last `fraction` of
  the training text) to the test shard is held out, so no group has text on both sides;

and `ShardSplit` gives the token span of each shard's training part and held-out part.

A file group is a run of consecutive files with one key (both editions of a Shakespeare play; a text
file is its own): `group_runs`, and `file_groups` reads them back from a dataset's meta.json (the
scoring script scores a stretch of text group by group). Every boundary snapped to a target is the
closest candidate, the earlier one on a tie (`closest`).
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, Sequence

import numpy as np

from reslm.core.errors import ReslmError
from reslm.data.tokenizer import safe_cut

DEFAULT_N_SHARDS = 6
MIN_SHARD_CHARS = 64


# --- file groups and boundaries -----------------------------------------------------------------
def group_runs(keys: Sequence[str]) -> list[tuple[int, int]]:
    """[i, j) index ranges of the runs of equal consecutive keys, in order."""
    runs: list[tuple[int, int]] = []
    for i, key in enumerate(keys):
        if runs and keys[runs[-1][0]] == key:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def file_groups(meta: dict, within: tuple[int, int] | None = None) -> list[tuple[str, int, int]]:
    """(group, start, end) of each file group of a dataset's token stream, in order, from the source
    files its meta.json records; [] when it records none (a BPE dataset's files carry no offsets).
    `within` (start, end): the groups overlapping that stretch, clipped to it."""
    source = meta.get("source")
    files = source.get("files") if isinstance(source, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, dict) and {"group", "start", "end"} <= f.keys()
                                              for f in files):
        return []
    rows = [(files[i]["group"], int(files[i]["start"]), int(files[j - 1]["end"]))
            for i, j in group_runs([f["group"] for f in files])]
    if within is None:
        return rows
    start, end = within
    return [(g, max(a, start), min(b, end)) for g, a, b in rows if max(a, start) < min(b, end)]


def closest(candidates: Sequence, target: float, key: Callable = lambda c: c):
    """The candidate whose position (`key`) is closest to `target`; the earlier one on a tie."""
    return min(candidates, key=lambda c: (abs(key(c) - target), key(c)))


# --- the splits a dataset is written with -------------------------------------------------------
def plan_shards(total: int, group_ends: Sequence[int] | None, n_shards: int = DEFAULT_N_SHARDS,
                min_shard_chars: int = MIN_SHARD_CHARS) -> tuple[list[list[int]], dict[str, Any]]:
    """Shard offsets [[start, end), ...] (last = test) and a description of the split.

    group_ends: cumulative end offsets of the contiguous groups (last == total); the
    train/test boundary is snapped to one of them. None: cut at exactly the target.
    """
    if n_shards < 2:
        raise ReslmError(f"n_shards must be at least 2 (one train, one test), got {n_shards}")
    n_train = n_shards - 1
    if total < n_shards * min_shard_chars:
        raise ReslmError(
            f"corpus too small: {total} characters cannot make {n_shards} shards "
            f"of at least {min_shard_chars} characters each"
        )
    target = total * n_train / n_shards
    if group_ends is None or len(group_ends) <= 1:
        boundary = total * n_train // n_shards
        rule = f"exact cut at {n_train}/{n_shards} of the text (no groups)"
    else:
        feasible = [b for b in group_ends[:-1]
                    if b >= n_train * min_shard_chars and total - b >= min_shard_chars]
        if not feasible:
            raise ReslmError(
                f"cannot split at a file boundary: no boundary leaves {n_train} training shards and "
                f"a test shard of at least {min_shard_chars} characters each"
            )
        boundary = closest(feasible, target)
        rule = (f"group boundary closest to {n_train}/{n_shards} of the text "
                f"(among those leaving every shard >= {min_shard_chars} chars)")
    # Train shards of equal size: the remainder is spread one char at a time.
    cuts = [boundary * i // n_train for i in range(n_train + 1)]
    shards = [[cuts[i], cuts[i + 1]] for i in range(n_train)] + [[boundary, total]]
    split = {"rule": rule, "target": round(target, 1), "boundary": boundary,
             "test_fraction": round((total - boundary) / total, 6)}
    return shards, split


AUTHORS_TRAIN_FRACTION = 0.9   # Shakespeare_Res/train_transformer.py: BASE["TRAIN_SPLIT"]
SPLITS = ("paper", "authors")  # a character dataset's split: plan_shards' shards, or plan_authors_split's two


def plan_authors_split(total: int, min_shard_chars: int = MIN_SHARD_CHARS) -> tuple[list[list[int]], dict[str, Any]]:
    """The split of the authors' published scripts (github fekoester/Shakespeare_Res,
    train_transformer.py: `split = int(len(text) * 0.9)`, train on text[:split], test on text[split:]): two
    shards, [0, int(0.9 total)) for training and the rest for the test, cut exactly there (no file-group
    snapping: a play may have text on both sides). Same return shape as plan_shards."""
    boundary = int(total * AUTHORS_TRAIN_FRACTION)   # the authors' expression, float product and all
    if boundary < min_shard_chars or total - boundary < min_shard_chars:
        raise ReslmError(f"corpus too small: {total} characters cannot make the authors' 90/10 split into two "
                         f"shards of at least {min_shard_chars} characters each")
    split = {"name": "authors",
             "rule": ("the authors' split (fekoester/Shakespeare_Res train_transformer.py): the first "
                      f"int({AUTHORS_TRAIN_FRACTION:g} * n) characters train, the rest test, an exact cut "
                      "(file groups ignored)"),
             "target": round(total * AUTHORS_TRAIN_FRACTION, 1), "boundary": boundary,
             "test_fraction": round((total - boundary) / total, 6)}
    return [[0, boundary], [boundary, total]], split


def plan_token_split(docs: Sequence, val_fraction: float, snap_to_groups: bool) -> dict[str, Any]:
    """Where a BPE corpus's validation starts: {'doc': index, 'offset': char offset inside it, ...}.
    `docs` are its documents in order, each with `n_chars`, `group` and `text()` (read only for a
    cut inside a document)."""
    total = sum(d.n_chars for d in docs)
    target = total * (1 - val_fraction)
    starts = np.cumsum([0] + [d.n_chars for d in docs]).tolist()
    if snap_to_groups:
        ends = [(starts[j], j) for _, j in group_runs([d.group for d in docs]) if j < len(docs)]
        if not ends:
            raise ReslmError("cannot split the corpus at a group boundary: it has only one group")
        boundary, doc = closest(ends, target, key=lambda e: e[0])
        return {"rule": f"group boundary closest to {1 - val_fraction:g} of the characters",
                "doc": doc, "offset": 0, "boundary_char": boundary, "total_chars": total}
    cut = int(round(target))
    cut = min(max(cut, 1), total - 1)
    i = bisect.bisect_right(starts, cut) - 1  # document holding character `cut`
    offset = cut - starts[i]
    if offset:
        offset = safe_cut(docs[i].text(), offset)
    return {"rule": (f"{1 - val_fraction:g} of the characters, moved back to just after a newline "
                     "followed by non-space inside that document if there is one"),
            "doc": i, "offset": offset, "boundary_char": starts[i] + offset, "total_chars": total}


def every_kth(val_fraction: float) -> tuple[int, Callable[[int], bool]]:
    """A streamed corpus's interleaved split: k = round(1 / val_fraction) (at least 2), and whether
    document i (0-based) is validation: documents k-1, 2k-1, ... (every k-th)."""
    every = max(2, round(1 / val_fraction))
    return every, lambda i: (i + 1) % every == 0


# --- the held-out text of a character run -------------------------------------------------------
def tail_start(a: int, b: int, fraction: float) -> int:
    """Where the held-out tail of the span [a, b) starts: its last `fraction` is held out."""
    return a + int((b - a) * (1 - fraction))


def check_tails(dataset, fraction: float, context: int, shard_chars: int = 0, name: str = "holdout") -> None:
    """ReslmError unless every training shard (its first `shard_chars` characters; 0: all) split by
    `fraction` keeps more than `context` characters to train on and at least one held out. `name` is
    the setting the message names (holdout, val_fraction)."""
    for shard in dataset.train_shards:
        a, b = dataset.shards[shard]
        n = min(b - a, shard_chars or b - a)
        keep = tail_start(0, n, fraction)
        if keep <= context or keep >= n:
            raise ReslmError(f"{name} {fraction} of a {n}-character training shard leaves {keep} characters to "
                             f"train on and {n - keep} held out (need more than the context {context}, and 1)")


def val_groups_cut(dataset, fraction: float, context: int) -> int:
    """Where the validation split of whole file groups starts: the group boundary closest to the last
    `fraction` of the training text (which ends at the test shard, itself cut at a group boundary), so
    that no group (a Shakespeare play in both editions) has text on both sides. The training shards
    end there; the text from there to the test shard is the validation split. ReslmError when the
    dataset records no groups or no boundary leaves every training shard more than `context`
    characters."""
    ends = dataset.group_ends()
    if not ends:
        raise ReslmError(f"val_split groups needs a dataset that records its files' groups; {dataset.name} does not "
                         "(re-create it with `reslm data`)")
    shards = [dataset.shards[s] for s in dataset.train_shards]
    first, last = min(a for a, _ in shards), max(b for _, b in shards)
    target = last - fraction * (last - first)
    # every training shard keeps more than `context` characters before the cut (or lies wholly before it)
    ok = [g for g in ends if first < g < last and all(b <= g or g - a > context for a, b in shards)]
    if not ok:
        raise ReslmError(f"val_split groups: no file-group boundary of {dataset.name} leaves every training shard more "
                         f"than {context} characters to train on before the validation split")
    return closest(ok, target)


class ShardSplit:
    """A character run's parts of its dataset's shards: each training shard's first `shard_chars`
    characters (0: all), of which a held-out part is kept out of training: the tail (its last
    `holdout`), or with `groups` the text from `val_cut` (val_groups_cut) on, which only the shards it
    reaches have (`heldout_shards`); with groups, `shard_chars` cuts the training part alone and the
    held-out file groups stay whole (the same validation text at every shard_chars). The test shard is
    whole."""

    def __init__(self, dataset, context: int, holdout: float = 0.0, shard_chars: int = 0, groups: bool = False):
        self.ds, self.context, self.holdout, self.shard_chars = dataset, context, holdout, shard_chars
        self.val_cut = val_groups_cut(dataset, holdout, context) if groups else None

    @classmethod
    def of_run(cls, dataset, context: int, tc, holdout: float) -> "ShardSplit":
        """A run's split, `holdout` of its training text held out (tc: its TrainConfig): as whole file
        groups when that is its validation split and its val_split is "groups", else as tails."""
        groups = bool(holdout and tc.val_split == "groups" and holdout == tc.val_fraction)
        return cls(dataset, context, holdout, tc.shard_chars, groups)

    def heldout_span(self, shard: int) -> tuple[int, int]:
        """Token span of a shard's held-out text itself (`span(shard, "heldout")` without the context
        before it)."""
        a, b = self.span(shard, "heldout")
        return a + self.context, b

    def span(self, shard: int, part: str = "train") -> tuple[int, int]:
        """Token span of a shard's training part or ("heldout") of its held-out part, which starts
        `context` tokens early so that its first sample predicts the first held-out character."""
        a, b = self.ds.shards[shard]
        if shard == self.ds.test_shard:
            return a, b
        if self.val_cut is not None:
            cut = min(max(a, self.val_cut), b)
            if part == "train":
                return a, min(cut, a + self.shard_chars) if self.shard_chars else cut
            return cut - self.context, b
        if self.shard_chars:
            b = min(b, a + self.shard_chars)
        if self.holdout:
            cut = tail_start(a, b, self.holdout)
        else:
            return a, b
        return (a, cut) if part == "train" else (cut - self.context, b)

    def heldout_shards(self) -> list[int]:
        """The training shards with held-out text: all of them (tails), or those the held-out file
        groups reach."""
        if self.val_cut is None:
            return list(self.ds.train_shards)
        return [s for s in self.ds.train_shards if self.ds.shards[s][1] > self.val_cut]
