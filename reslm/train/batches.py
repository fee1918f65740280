"""Data -> batches: the two batch samplers the training loop draws from, and the features they batch.

The loop (reslm.train) knows nothing of characters or tokens; it asks its sampler (`SAMPLERS[kind]`,
kind = the family's data kind, "chars" or "tokens") for:

    total, eval_points        optimizer steps in all, and the steps after which to evaluate
    batches(step)             the micro-batches of one step, [(x, y), ...]
    weights(micro)            each micro-batch's share of the step's loss, and the step's sample count
    evaluate(model, prec, final)  the held-out loss row (reslm.train.evaluation; CharShards: test
                              shard, nats and bits per character; TokenWindows: val windows, per token)
    segment(step)             the schedule position logged beside a step (shard-epoch or nothing)
    eval_at_start             whether the untrained model is evaluated at step 0 (tokens: a reference)
    samples_per_step          samples (characters or windows) one optimizer step covers

* `CharShards`, the paper's character protocol ("Training", "Dataset and Methodology"): for each
  cycle, for each training shard, the model's features (reservoir states) are computed once, then
  E shard-epochs of shuffled batches over them, each followed by the test cross-entropy on the test
  shard (nats and bits per character). The shuffle of shard-epoch k is seeded by step_seed(seed, k).
  A model whose `all_positions` says "chunks" (a causal transformer) or "streams" (a recurrent model in
  stream mode) trains on every position of `context`-character chunks instead (ChunkFeatures): the
  batch and the epoch still count targets, so a step of batch_size 1024 is 32 chunks of 32 targets,
  and the test CE is still each test character's prediction from its `context` characters.
  `StateCache` (reslm.run.state_cache) keeps computed states in the run folder for a resumed run.
  Which text of each shard is trained on and which held out is reslm.data.splits.ShardSplit's.
* `TokenWindows`, token level (Appendix A.3 and the authors' code): random windows of the model's
  context from the dataset's train view, seeded per step; every eval_every steps the mean CE over
  eval_batches fixed-seed val windows.

The samplers take the model as an argument (its `features`, `forward_features`, `config.context`);
this module imports no model family and nothing of the loop: the features helpers it shares with the
models are reslm.features, the state cache is reslm.run.state_cache, the optimizers that solve a readout in
one step are reslm.train.optim.SOLVERS, the evaluations are reslm.train.evaluation's.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from reslm.core.device import (WORKING_BYTES, check_memory, reservoir_pass_bytes, state_dtype, state_dtypes,
                               synchronize)
from reslm.core.errors import ReslmError
from reslm.data.splits import ShardSplit, check_tails, val_groups_cut
from reslm.features import ChunkFeatures
from reslm.reservoir.physical import noise_stream, train_key
from reslm.reservoir.seeding import child_seed
from reslm.run.state_cache import StateCache
from reslm.settings import evaluated
from reslm.train.evaluation import TestShardLoss, eval_slices, final_samples, window_loss
from reslm.train.optim import SOLVERS

_EVAL_SEED = 0x5EED_E7A1   # seeds the val windows of a token run's evaluations


# --- seeding ------------------------------------------------------------------------------------
TRAIN_KEY = 100  # seeding key of training draws, apart from the reservoir's matrix keys (0, 1, 2, layers)


def step_seed(seed: int, position: int) -> int:
    """The seed of one schedule position (a step's draws and dropout, a shard-epoch's shuffle): a child of
    the run seed in the one seeding scheme (reslm.reservoir.seeding)."""
    return child_seed(seed, TRAIN_KEY, position)



# --- the samplers ---------------------------------------------------------------------------------
def state_rows(dataset, split: ShardSplit, tc, context: int) -> tuple[int, int, int, int]:
    """What a character reservoir run holds states for at once (reslm.core.device.state_dtypes): (the longest
    training shard's positions, the test positions its largest evaluation scores, the longest held-out span
    scored while a training shard's states are held, 0 without held-out text), and the longest text one
    reservoir pass reads."""
    longest = max(b - a for a, b in (split.span(s) for s in dataset.train_shards))
    ta, tb = split.span(dataset.test_shard)
    n_test = max(sum(sl.stop - sl.start - context for sl in eval_slices(tb - ta, context, n))
                 for n in {tc.eval_samples, final_samples(tc)})
    heldout = max((b - a for a, b in (split.span(s, "heldout") for s in split.heldout_shards())), default=0) \
        if tc.heldout else 0
    return longest, n_test, heldout, max(longest, tb - ta, heldout)


def pass_bytes(config, reservoir, positions: int, itemsize: int) -> int:
    """The reservoir's working buffers over `positions` characters in one pass (reslm.core.device.
    reservoir_pass_bytes: what its streams, warm-up and context scale); none for a recording it replays."""
    if getattr(reservoir, "replays", False):
        return 0
    return reservoir_pass_bytes(config.context_mode, positions, getattr(reservoir, "size", None) or config.size,
                                config.embed_dim, config.context, getattr(config, "streams", 1),
                                getattr(config, "warmup", None), getattr(config, "readout_dim", 0) or 0, itemsize)


def pass_fix(config, flag: str = "--") -> str:
    """The flag that shrinks a reservoir's pass (pass_bytes), written as `flag` + its name (the frontier bench's:
    "--set ")."""
    if config.context_mode == "stream":
        return (f"give a smaller {flag}streams (now {config.streams:,}; each stream holds a state and its work "
                "buffers)")
    return f"give a smaller {flag}context (now {config.context:,})"


def has_reservoir(model) -> bool:
    """Whether `model` is a character reservoir model (its features are reservoir states: they may be
    cached, stored in bfloat16, and computed in their own dtype)."""
    return isinstance(getattr(model, "reservoir", None), torch.nn.Module)


class CharShards:
    """Shard-cyclic batches over precomputed features (the paper's protocol), see the module doc.

    The schedule is a list of shard-epochs (cycle, shard, epoch); shard-epoch k has ceil(n_k / batch)
    steps over a permutation seeded by step_seed(seed, k). Evaluation after every shard-epoch. A ridge
    run's schedule is one step, the solve (reslm.train.ridge reads `train_features` / `heldout_features`).

    holdout > 0 keeps the last fraction of each training shard's characters out of training: those
    are `heldout_features` (ridge's alpha and temperature, `reslm search`'s objective, or the
    validation split), never the test shard. A validation split with val_split "groups" holds out
    whole file groups at the end of the training text instead, so only the shards it reaches have
    held-out text (`heldout_shards`). The spans are `split`'s (reslm.data.splits.ShardSplit)."""

    kind = "chars"                  # the dataset kind it reads (a family's `data`)
    default_data = "shakespeare"    # the dataset `reslm train` uses when none is given
    make_data = "reslm data shakespeare|text"
    eval_kind = "test"
    eval_at_start = False           # no evaluation of the untrained model
    has_cycles = True               # grows by passes over the training shards (reslm.train.grow_cycles)

    def __init__(self, model, dataset, tc, device: torch.device, log, progress: bool, world: int = 1,
                 rank: int = 0, holdout: float = 0.0, cache: Path | None = None):
        if world > 1:
            raise ReslmError("multi-process training (torchrun) is for the token families (laerc, gpt)")
        self.model, self.ds, self.tc, self.device, self.log, self.progress = model, dataset, tc, device, log, progress
        self.holdout = holdout
        self.split = ShardSplit.of_run(dataset, model.config.context, tc, holdout)
        self.cache = StateCache(cache) if cache is not None and has_reservoir(model) else None
        self.context = model.config.context
        # all-position training ("chunks" | "streams"): a sample is a chunk of `context` characters
        self.layout = getattr(model, "all_positions", None)
        # targets per sample: a chunk's last chunk_targets positions (its context by default), or one
        self.per_sample = getattr(model, "chunk_targets", self.context) if self.layout else 1
        self.batch_samples = tc.batch_size // self.per_sample       # samples per step
        self.plan = [(c, s, e) for c in range(tc.cycles) for s in dataset.train_shards
                     for e in range(tc.epochs_per_shard)]
        self.samples = [self._n_samples(s) for _, s, _ in self.plan]
        steps = [math.ceil(n / self.batch_samples) for n in self.samples]
        self.ends = list(np.cumsum(steps))                  # the step after which shard-epoch k ends
        train = dict(eval_at=tc.eval_at, epochs_per_shard=tc.epochs_per_shard)
        self.eval_points = [int(end) for end, (c, _, e) in zip(self.ends, self.plan) if evaluated(train, c, e)]
        self.total = int(self.ends[-1]) if self.ends else 0
        if tc.optimizer in SOLVERS:
            self.eval_points, self.total = [1], 1
        self._feats, self._feats_shard, self._order_k, self._order = None, None, None, None
        self._epoch_feats = None     # the chunks of the current shard-epoch (all-position training)
        self.test_loss = TestShardLoss(self)   # the test CE (reslm.train.evaluation)
        self.state_seconds = 0.0
        self.logged_states = set()   # (cycle, shard, part) whose "states" row the log has (a resumed run)
        self.dtype, compute = self._choose_dtypes()
        self.kw = dict(dtype=self.dtype, **({"compute_dtype": compute} if has_reservoir(model) else {}))
        self.samples_per_step = tc.batch_size

    @staticmethod
    def caches(model) -> bool:
        """Whether `cache` (RUN/states) applies: the features of a reservoir model are worth keeping."""
        return has_reservoir(model)

    @staticmethod
    def check_run(family_name: str, dataset, model_cfg, tc) -> None:
        """ReslmError when a run of `family_name` with these configs cannot train on `dataset`."""
        context = model_cfg.context
        shortest = min(e - s for s, e in dataset.shards)
        if context >= shortest:
            raise ReslmError(f"context {context} is not shorter than the smallest shard ({shortest} chars)")
        if 0 < tc.shard_chars <= context:
            raise ReslmError(f"shard_chars {tc.shard_chars} must exceed the context ({context})")
        if getattr(model_cfg, "all_positions", None):
            mode, per = model_cfg.context_mode, getattr(model_cfg, "chunk_targets", context)
            if tc.batch_size % per:
                raise ReslmError(f"{mode} mode counts the batch in targets, {per} per chunk: batch_size "
                                 f"{tc.batch_size} is not a multiple of {per}")
            if mode == "stream" and tc.grad_accum > 1:
                raise ReslmError("stream mode carries the state from one batch to the next: grad_accum must be 1")
            if tc.optimizer in SOLVERS:
                raise ReslmError(f"optimizer {tc.optimizer} solves a reservoir readout, not a {mode}-mode model")
        if tc.optimizer in SOLVERS:
            if family_name != "rc":
                raise ReslmError(f"optimizer {tc.optimizer} solves the linear readout of the rc family, not {family_name}")
            if tc.optimizer == "ridge" and (model_cfg.head, model_cfg.head_input) != ("linear", "state"):
                raise ReslmError("optimizer ridge solves a linear head on the state alone (--head linear, "
                                 "--head-input state)")
            if model_cfg.head != "linear":
                raise ReslmError(f"optimizer {tc.optimizer} solves a linear head (--head linear), not {model_cfg.head}")
            check_tails(dataset, tc.holdout, context, tc.shard_chars)
        elif tc.heldout_eval:
            check_tails(dataset, tc.holdout, context, tc.shard_chars)
        if tc.val_fraction and tc.val_split == "groups":
            val_groups_cut(dataset, tc.val_fraction, context)
        elif tc.val_fraction:
            check_tails(dataset, tc.val_fraction, context, tc.shard_chars,
                        "holdout" if tc.val_fraction == tc.holdout else "val_fraction")

    @staticmethod
    def weights(micro) -> tuple[list[float], int]:
        """Each micro-batch's share of the step's mean loss (by its sample count), and the step's
        sample count, which weighs the step in a segment's mean train loss."""
        n = sum(y.numel() for _, y in micro)
        return [y.numel() / n for _, y in micro], n

    def rate_fields(self, samples_per_s: float) -> dict:
        """Throughput figures of a "step" row beyond samples per second: none for characters."""
        return {}

    def summary_fields(self, cfg: dict, steps: int) -> dict:
        """Which context the test CE gives each character: its `context` preceding characters read
        from a zero state (window; the paper's metric, also for causal and stream-mode training), or
        the reservoir state carried through the test text (a stream-mode reservoir)."""
        carried = has_reservoir(self.model) and cfg["model"].get("context_mode") == "stream"
        return {"test_metric": "stream" if carried else f"window-{self.context}"}

    def _n_samples(self, shard: int) -> int:
        """Samples of one shard-epoch: windows (one target each) or, for all-position training, chunks
        (epoch_samples counts targets in both)."""
        a, b = self.split.span(shard)
        if not self.layout:
            n = b - a - self.context
            return min(n, self.tc.epoch_samples) if self.tc.epoch_samples else n
        streams = self.batch_samples if self.layout == "streams" else 0
        n = ChunkFeatures.count(b - a, self.context, streams, stride=self.per_sample)
        if self.tc.epoch_samples:
            n = min(n, max(1, self.tc.epoch_samples // self.per_sample))
        return n // streams * streams if streams else n   # whole steps: every piece moves on together

    def tokens(self, shard: int, part: str = "train") -> torch.Tensor:
        """The tokens of a shard's part (reslm.data.splits.ShardSplit.span) on the device."""
        a, b = self.split.span(shard, part)
        return torch.from_numpy(np.asarray(self.ds.tokens[a:b], dtype=np.int64)).to(self.device)

    def _choose_dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        """(storage, compute) dtypes of the reservoir states: a reservoir model holds one training shard's
        states, the test states and, while it evaluates, one shard's held-out states
        (reslm.core.device.state_dtypes)."""
        name = self.tc.state_dtype
        if not has_reservoir(self.model):
            return state_dtype("float32" if name == "auto" else name), None
        longest, n_test, heldout, text = state_rows(self.ds, self.split, self.tc, self.context)
        cfg = self.model.config   # the pass's buffers first: its own flag (the streams), not the states' dtype
        extra = pass_bytes(cfg, self.model.reservoir, text, 2 if name == "bfloat16" else 4)
        check_memory(extra + WORKING_BYTES, "the reservoir's pass over a shard", pass_fix(cfg), self.device)
        return state_dtypes(name, self.device, self.model.width, longest, n_test, heldout, extra_bytes=extra)

    def position(self, step: int) -> int:
        """The shard-epoch that step `step` (0-based) belongs to."""
        return int(np.searchsorted(self.ends, step, side="right"))

    def segment(self, step: int) -> dict:
        k = self.position(step)
        cycle, shard, epoch = self.plan[k]
        return dict(index=k, cycle=cycle, shard=shard, epoch=epoch)

    def _compute(self, shard: int, cycle: int, part: str = "train"):
        """The features of a shard's part, timed and logged as a "states" row (read back from the
        state cache when an earlier process of this run left them there)."""
        t0 = time.perf_counter()
        a, _ = self.split.span(shard, part)   # noise rows are indexed by the position in the shard
        noise = noise_stream(self.model, train_key(cycle, shard), a - self.ds.shards[shard][0])
        # without measurement noise a shard's states are the same in every cycle: one file serves them all
        noisy = bool(noise) and self.model.physical.config.state_noise > 0
        name = f"{part}-shard{shard}" + (f"-cycle{cycle}" if noisy else "")
        feats = self.cache.load(name, self.dtype) if self.cache else None
        if feats is None:
            feats = self.model.features(self.tokens(shard, part), position=a, progress=self.progress, **self.kw,
                                        **noise)
            if self.cache and part == "train":   # this shard's and the test states; every shard's when
                # the schedule comes back to them in a later cycle (and the disk has room)
                self.cache.store(name, feats, keep_prefix="test-", keep_all=not noisy and self.tc.cycles > 1)
            cached = False
        else:
            cached = True
        synchronize(self.device)
        dt = time.perf_counter() - t0
        self.state_seconds += dt
        # one row per shard and cycle, as in an uninterrupted run: a resumed run computing (or reading
        # back) the states of the shard it stopped in does not log them again (the log is per run, not
        # per attempt; the attempt's time is in its train seconds)
        if self.log is not None and (cycle, shard, part if self.holdout else None) not in self.logged_states:
            self.log.write(dict(kind="states", cycle=cycle, shard=shard, **({"part": part} if self.holdout else {}),
                                **({"cached": True} if cached else {}),
                                seconds=round(dt, 4), tokens_per_s=round(len(feats) / dt, 1)))
        return feats

    def _features(self, shard: int, cycle: int):
        if self._feats_shard != shard:
            self._feats = self._epoch_feats = None  # free the previous shard's states first (both references)
            self._feats = self._compute(shard, cycle)
            self._feats_shard = shard
        return self._feats

    def train_features(self, shard: int):
        """Features of a training shard's training part (all of it without holdout), cached until the next shard."""
        return self._features(shard, 0)

    def heldout_shards(self) -> list[int]:
        """The training shards with held-out text: all of them (tails), or those the held-out file
        groups reach (val_split groups)."""
        return self.split.heldout_shards()

    def heldout_features(self, shard: int):
        """Features of a training shard's held-out tail (needs holdout > 0); not cached."""
        if not self.holdout or shard == self.ds.test_shard:
            raise ReslmError("held-out features need holdout > 0 and a training shard")
        return self._compute(shard, 0, "heldout")

    def _chunks(self, shard: int, k: int) -> ChunkFeatures:
        """All-position samples of shard-epoch k: contiguous chunks at a phase drawn for the epoch (so
        that a character is not always at the same place in its chunk), or the shard's pieces side by
        side (streams)."""
        if self.layout == "streams":
            return ChunkFeatures(self.tokens(shard), self.context, streams=self.batch_samples)
        phase = step_seed(self.tc.seed, k) % self.per_sample   # chunks overlap when they score a part
        return ChunkFeatures(self.tokens(shard), self.context, phase=phase, stride=self.per_sample)

    def batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The micro-batches of optimizer step `step`."""
        k = self.position(step)
        cycle, shard, _ = self.plan[k]
        first = self.ends[k - 1] if k else 0
        if self.layout:
            feats = self._epoch_feats if self._order_k == k else self._chunks(shard, k)
            if self.layout == "streams" and step == first:
                self.model.reset_carry()   # every piece starts from the zero state
        else:
            feats = self._features(shard, cycle)
        if self._order_k != k:
            if self.layout == "streams":
                order = torch.arange(len(feats))   # in order: batch j continues batch j - 1
            else:
                order = torch.randperm(len(feats), generator=torch.Generator().manual_seed(step_seed(self.tc.seed, k)))
            self._order, self._order_k, self._epoch_feats = order[:self.samples[k]].to(self.device), k, feats
        bs = self.batch_samples
        index = self._order[(step - first) * bs:(step - first + 1) * bs]
        scored = slice(-self.per_sample, None) if self.layout else slice(None)   # a chunk's scored (last) positions
        return [(feats.batch(i), feats.targets[i][..., scored]) for i in index.tensor_split(self.tc.grad_accum)
                if i.numel()]

    def state_dict(self) -> dict:
        """What a checkpoint needs besides the weights to continue exactly: a stream-mode model's
        carried state."""
        return {"carry": self.model.carry} if self.layout == "streams" else {}

    def load_state_dict(self, state: dict) -> None:
        if self.layout == "streams":
            self.model.carry = state.get("carry")

    def evaluate(self, model, precision: str, final: bool = False) -> dict:
        """The test CE row (reslm.train.evaluation.TestShardLoss)."""
        return self.test_loss(model, precision, final)


def token_batch(data, batch: int, context: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` random windows of context+1 tokens: x = chunk[:-1], y = chunk[1:], (batch, context) int64."""
    n = len(data)
    if n <= context:
        raise ReslmError(f"context {context} is not shorter than the data ({n} tokens)")
    offsets = torch.randint(0, n - context, (batch,), generator=generator).tolist()
    chunks = torch.from_numpy(np.stack([np.asarray(data[o:o + context + 1], dtype=np.int64) for o in offsets]))
    return chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous()


class TokenWindows:
    """Random windows of the model's context from the train view (memory-mapped), seeded per step; every
    eval_every steps (and at the end) the mean CE over eval_batches fixed-seed val batches."""

    kind = "tokens"
    default_data = "shakespeare-gpt2"
    make_data = "reslm data bpe"
    eval_kind = "val"
    eval_at_start = True            # the untrained model's val loss, for reference (step 0)
    has_cycles = False              # trains for max_steps

    def __init__(self, model, dataset, tc, device: torch.device, log, progress: bool, world: int = 1,
                 rank: int = 0, holdout: float = 0.0, cache: Path | None = None):
        if tc.batch_size % world:
            raise ReslmError(f"batch_size {tc.batch_size} is not divisible by the number of processes ({world})")
        self.tc, self.device, self.ds = tc, device, dataset
        self.context = model.config.context
        self.rows = slice(rank * (tc.batch_size // world), (rank + 1) * (tc.batch_size // world))
        self.world = world
        self.total = tc.max_steps
        self.eval_points = sorted({*range(tc.eval_every, tc.max_steps, tc.eval_every), tc.max_steps})
        self.state_seconds = 0.0
        self.samples_per_step = tc.batch_size * tc.grad_accum

    @staticmethod
    def caches(model) -> bool:
        return False

    @staticmethod
    def check_run(family_name: str, dataset, model_cfg, tc) -> None:
        context = model_cfg.context
        if tc.heldout_eval:
            raise ReslmError("heldout_eval holds out the tails of character shards; token runs evaluate on val.bin")
        for split, n in (("train", len(dataset.train)), ("val", len(dataset.val))):
            if context >= n:
                raise ReslmError(f"context {context} is not shorter than the {split} split ({n} tokens)")

    @staticmethod
    def weights(micro) -> tuple[list[float], int]:
        """Equal shares of the step's loss (every micro-batch holds batch_size windows); a step counts
        once in a segment's mean train loss."""
        return [1 / len(micro)] * len(micro), 1

    def rate_fields(self, samples_per_s: float) -> dict:
        return {"tokens_per_s": round(samples_per_s * self.context, 1)}

    def summary_fields(self, cfg: dict, steps: int) -> dict:
        tc = cfg["train"]
        return {"tokens_seen": steps * tc["batch_size"] * tc["grad_accum"] * cfg["model"]["context"]}

    def segment(self, step: int) -> dict:
        return {}

    def batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(step_seed(self.tc.seed, step))
        out = []
        for _ in range(self.tc.grad_accum):
            x, y = token_batch(self.ds.train, self.tc.batch_size, self.context, gen)  # the same draws on every rank
            if self.world > 1:
                x, y = x[self.rows], y[self.rows]
            out.append((x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)))
        return out

    def val_batches(self):
        """The eval_batches windows of the val view that every evaluation scores (a fixed seed)."""
        gen = torch.Generator().manual_seed(_EVAL_SEED + self.tc.seed)
        return (tuple(t.to(self.device) for t in token_batch(self.ds.val, self.tc.batch_size, self.context, gen))
                for _ in range(self.tc.eval_batches))

    def evaluate(self, model, precision: str, final: bool = False) -> dict:
        """The val CE row over `val_batches` (reslm.train.evaluation.window_loss)."""
        return window_loss(model, self.val_batches(), precision)


SAMPLERS = {"chars": CharShards, "tokens": TokenWindows}   # a family's data kind -> its sampler

