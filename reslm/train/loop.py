"""Training: one loop for every family; only the batch source differs.

    for step in 0..total-1:
        lr(step)                                   constant (chars) or warmup-hold-cosine (tokens)
        grad_accum micro-batches from the source   drawn from a generator seeded by step_seed(seed, .)
        Adam / AdamW step (clipping, fp16 loss scaling), non-finite loss or gradient -> stop
        at the source's evaluation points: evaluate, log, checkpoint (atomically)

The batch source is the family's sampler (reslm.train.batches: `CharShards`, the paper's shard-cyclic
character protocol; `TokenWindows`, random token windows, Appendix A.3 and TOKEN_TRAIN in reslm.settings).
It gives the schedule, the micro-batches and their weights, and the held-out evaluation, so the loop
has no branch on the kind of data. TrainConfig fields that only one kind uses carry it in their field
metadata (`data_fields`), from which the CLI hides the other kind's flags.

The rc family's readout can instead be solved in closed form (`optimizer="ridge"`, reslm.train.ridge; or to
its cross-entropy optimum by full-batch L-BFGS, `optimizer="lbfgs"`, reslm.train.lbfgs): one
pass over the training shards' features, alpha and the softmax temperature chosen on held-out tails of
the training shards, then the same test evaluation, checkpoint and summary as an Adam run.

Dropout is seeded per step, so a run resumed from any checkpoint is the same computation as an
uninterrupted one (bitwise, on the same machine). Under `torchrun --nproc_per_node=K` (token families)
each step's windows are drawn as in one process and rank r trains on its 1/K of the rows; only rank 0
writes. The run directory (reslm.run) is the interface to everything after training.
"""
from __future__ import annotations

import contextlib
import gc
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from reslm.core import claims, stop
from reslm.core import distributed as dist_
from reslm.core.device import (device_name, grad_scaler, pick_device, resolve_precision, setup_cuda,
                               synchronize, use_threads)
from reslm.core.errors import ReslmError
from reslm.core.files import read_json
from reslm.core.metrics import HELDOUT_LOSS, LBFGS_TRAIN_LOSS, TEST_BPC, TEST_LOSS, TRAIN_LOSS, VAL_LOSS, bits
from reslm.core.progress import bar as progress_bar
from reslm.core.progress import say
from reslm.data.datasets import check_dataset, ensure_dataset, open_dataset
from reslm.models.load import check_source, load_model
from reslm.reservoir.registry import SOURCES
from reslm.run import (SUMMARY, MetricsLog, is_finished, load_checkpoint, lock_run, read_config, read_metrics,
                       save_checkpoint)
from reslm.run.registry import only_trainable, with_fixed
from reslm.run.source import record_source
from reslm.settings import TrainConfig
from reslm.train import continuation
from reslm.train.batches import step_seed
from reslm.train.compiled import choose_window_step, compiled_forward
from reslm.train.evaluation import HeldoutLoss
from reslm.train.config import CHECKPOINT_SECONDS, STATES, sampler_for
from reslm.train.ema import EMA, checkpoint_weights
from reslm.train.meter import Meter
from reslm.train.optim import SOLVERS, make_optimizer, set_lr
from reslm.train.step import train_step
from reslm.train.summary import summarize


def _score(model, state: dict, evaluate, precision: str) -> dict:
    """The final evaluation (whole test shard, validation split) of the weights `state`; the model's
    own weights are put back afterwards."""
    own = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(with_fixed(model, state))
    try:
        return evaluate(model, precision, final=True)
    finally:
        model.load_state_dict(own)


def past(until: float | None) -> bool:
    """Whether the wall-clock deadline `until` (time.time(); None: none) has passed."""
    return until is not None and time.time() >= until


def _sampler_state(source) -> dict:
    """What the batch source needs kept in a checkpoint besides the weights (CharShards.state_dict)."""
    return source.state_dict() if hasattr(source, "state_dict") else {}


def train(run_dir: Path, *, progress: bool = True, stop_at: int | None = None,
          checkpoint_seconds: float = CHECKPOINT_SECONDS, cache_states: bool | str = False,
          until: float | None = None, data_root: Path | None = None) -> dict:
    """Train (or continue training) the run in run_dir; returns the summary (also summary.json).

    The run's dataset is looked up as open_dataset does (`data_root`: where a published run's dataset
    is, default $RESLM_DATA or ./data) and built first when missing and buildable (ensure_dataset).

    `stop_at`: stop (after an evaluation and a checkpoint) once this many steps are done; a later call
    resumes. `until`: a wall-clock deadline (time.time()): the first step that ends past it stops the
    run the same way (a checkpoint; a later call resumes). Between evaluations a checkpoint is also written every `checkpoint_seconds` of training,
    so a kill loses at most that much work even when an evaluation is hours away (a transformer's
    paper-protocol shard-epoch on a CPU); it holds the running window of the segment's train loss, and
    the resumed run logs what an uninterrupted one does. The run directory is locked while this runs (a
    second trainer of the same run gets ReslmError). Under torchrun every rank calls this and rank 0
    holds the lock (see the module doc).

    `cache_states` (character reservoir runs): keep the computed features in RUN/states (StateCache),
    so that a resumed run does not compute the current shard's and the test states again, nor a later
    cycle a shard's; the folder is removed once the run is finished. "auto": where the run has
    reservoir states (True refuses a run without them)."""
    run_dir = Path(run_dir)
    with lock_run(run_dir) if dist_.env_world()[0] == 0 else contextlib.nullcontext():
        try:
            summary = _train(run_dir, progress, stop_at, checkpoint_seconds, cache_states, until, data_root)
        finally:   # its states freed now (the sampler and its test loss refer to each other: only the cycle
            gc.collect()   # collector frees them), and their memory claim dropped (reslm.core.device.state_dtypes)
            claims.release()
        if is_finished(run_dir):
            shutil.rmtree(run_dir / STATES, ignore_errors=True)
        return summary


@dataclass
class _Training:
    """An Adam run being trained: the parts its jobs (a training step, an evaluation, a checkpoint)
    share, and where it stands: the steps done, the seconds trained, the segment's running sums (Meter)
    and, under keep_best_val, the best evaluation so far ({step, val_loss, model})."""
    run_dir: Path
    tc: TrainConfig
    model: torch.nn.Module
    source: Any                  # the family's batch source (reslm.train.batches)
    log: MetricsLog | None       # rank 0's; None on the other ranks
    device: torch.device
    precision: str
    main: bool                   # rank 0: it logs and writes
    progress: bool
    evaluate: Callable           # the held-out evaluation: the source's, or HeldoutLoss
    opt: torch.optim.Optimizer
    scaler: Any
    params: list                 # the trainable parameters, clipped and checked in this order
    ema: EMA | None
    ddp: Any = None              # the DistributedDataParallel wrapper under torchrun
    forward: Callable | None = None
    step: int = 0
    train_seconds: float = 0.0
    meter: Meter = field(default_factory=Meter)
    best: dict | None = None
    window_step: str = "plain"   # the step the transformer's window mode takes (reslm.train.compiled)


def _train(run_dir: Path, progress: bool, stop_at: int | None, checkpoint_seconds: float,
           cache_states: bool | str, until: float | None = None, data_root: Path | None = None) -> dict:
    """train() inside the run's lock: the run opened, its readout solved (SOLVERS) or trained step by
    step to `stop_at` (resumed from its checkpoint), with an evaluation and a checkpoint at each of the
    source's evaluation points and a checkpoint every `checkpoint_seconds` between them; then summarised."""
    cfg = read_config(run_dir)
    tc = TrainConfig.of_run(cfg)
    rank, world, local_rank = dist_.init(tc.device)
    main = rank == 0
    model, source, log, device, precision = _open(run_dir, cfg, tc, data_root, cache_states, progress,
                                                  rank, world, local_rank)
    if tc.optimizer in SOLVERS:
        return _train_ridge(run_dir, cfg, model, source, log, precision, progress)
    t = _optimisation(run_dir, tc, model, source, log, device, precision, main, progress)
    ck = load_checkpoint(run_dir, map_location=device)
    _resume(t, ck)
    _wrap_forward(t, world)
    _say_if_step_changed(t, ck)
    end = source.total if stop_at is None else max(0, min(source.total, stop_at))
    evals = set(source.eval_points) | {end}

    if ck is None and source.eval_at_start:  # the untrained model's val loss, for reference (step 0)
        row = source.evaluate(model, precision)
        if main:
            log.write(dict(kind="eval", step=0, **row))
    bar = progress_bar(total=source.total, initial=t.step, enabled=progress and main and t.step < end,
                       desc=f"{cfg.get('preset') or cfg['family']}", unit="step")
    model.train()
    t.meter.start_clock()
    # SIGTERM stops a one-process run at the end of its step, as the deadline does (ranks would part ways)
    with stop.graceful() if world == 1 else contextlib.nullcontext():
        while t.step < end:
            lr = _train_step(t)
            bar.update(1)
            if t.step % tc.log_every == 0:
                _log_step(t, lr, bar)
            if t.step in evals:
                _evaluation_point(t)
            elif main and (time.perf_counter() - t.meter.t_saved >= checkpoint_seconds or past(until)
                           or stop.requested()):
                _checkpoint(t, segment=t.meter.state(time.perf_counter()))
                t.meter.t_saved = time.perf_counter()
            if past(until) or stop.requested():
                say(f"stopped at step {t.step}/{source.total}: {'the deadline' if past(until) else 'asked to stop'}; "
                    "--resume continues", enabled=progress and main)
                break
    bar.close()
    summary = summarize(run_dir, model, cfg, source, eval_kind=getattr(t.evaluate, "eval_kind", None)) if main else None
    if world > 1:
        dist_.barrier()  # summary.json is written
    return summary if main else read_json(run_dir / SUMMARY)


def _open(run_dir: Path, cfg: dict, tc: TrainConfig, data_root: Path | None, cache_states: bool | str,
          progress: bool, rank: int, world: int, local_rank: int):
    """The run's parts: its dataset (built when missing, checked against the config), the device and
    precision, the model, rank 0's metrics log and the family's batch source (keeping its states in
    RUN/states under `cache_states`). Returns (model, source, log, device, precision)."""
    ensure_dataset(cfg, data_root)
    dataset = open_dataset(cfg["data"], data_root)
    check_dataset(cfg, dataset)
    _keep_source(run_dir, cfg, rank == 0)
    device, precision = _device(tc, world, local_rank)
    model = load_model(cfg, device)
    sampler = sampler_for(cfg["family"])
    if cache_states == "auto":
        cache_states = sampler.caches(model)
    if cache_states and not sampler.caches(model):
        raise ReslmError(f"--cache-states keeps a character reservoir run's states; a {cfg['family']} run has none")
    log = MetricsLog(run_dir) if rank == 0 else None
    source = sampler(model, dataset, tc, device, log, progress and rank == 0, world=world, rank=rank,
                     cache=run_dir / STATES if cache_states else None,
                     holdout=tc.heldout)
    return model, source, log, device, precision


def _keep_source(run_dir: Path, cfg: dict, main: bool) -> None:
    """A run trained on a reservoir a user's file registered (`--import`: reslm.reservoir.registry.SOURCES)
    records that file in its folder (rank 0): its name, sha256 and a copy to read (reslm.run.source), once the
    file this process ran is the one the run recorded before, if it did (check_source)."""
    check_source(run_dir, cfg, how="continue it with `reslm frontier bench ... --import FILE.py` and that file")
    reservoir = cfg["model"].get("reservoir") if isinstance(cfg.get("model"), dict) else None
    ran = SOURCES.get(reservoir) if isinstance(reservoir, str) else None
    if main and ran is not None:
        record_source(run_dir, reservoir, ran["name"], ran["path"], ran["code"])


def _device(tc: TrainConfig, world: int, local_rank: int) -> tuple[torch.device, str]:
    """Where the run trains and at what precision: its threads, its device (under torchrun on CUDA,
    this rank's GPU) and the precision resolved for it."""
    if tc.threads:
        use_threads(tc.threads)   # a saved count above this machine's cores: its cores, with a note
    device = pick_device(tc.device)
    if world > 1 and device.type == "cuda":
        device = torch.device("cuda", local_rank)
    precision = resolve_precision(tc.precision, device)
    setup_cuda()
    return device, precision


def _optimisation(run_dir: Path, tc: TrainConfig, model, source, log: MetricsLog | None,
                  device: torch.device, precision: str, main: bool, progress: bool) -> _Training:
    """An Adam run at step 0: its held-out evaluation (the source's; HeldoutLoss on held-out tails or on
    the validation split), optimiser, loss scaler, the parameters it clips and checks, and the EMA."""
    evaluate = (HeldoutLoss(source) if tc.heldout_eval else
                HeldoutLoss(source, "val", with_test=True) if tc.val_fraction else source.evaluate)
    return _Training(run_dir, tc, model, source, log, device, precision, main, progress, evaluate,
                     opt=make_optimizer(model, tc, device), scaler=grad_scaler(precision, device),
                     params=[p for p in model.parameters() if p.requires_grad],
                     ema=EMA(model, tc.ema) if tc.ema else None)


def _wrap_forward(t: _Training, world: int) -> None:
    """The training forward: under torchrun DDP's wrapper of the model (evaluation and checkpoints use the
    model itself), else the model's, compiled under --compile; the transformer's window step chosen first.
    A model with parameters that never get a gradient (LAERC's LN_res, which only feeds the no-grad
    reservoir) says so, and DDP then looks for them each step instead of waiting for them forever."""
    if world > 1:
        t.ddp = torch.nn.parallel.DistributedDataParallel(
            t.model, device_ids=[t.device.index] if t.device.type == "cuda" else None,
            find_unused_parameters=bool(getattr(t.model, "has_unused_parameters", False)))
    t.window_step = choose_window_step(t.model, t.tc.window_step, t.tc.compile, t.device, t.precision,
                                       announce=t.main)
    t.forward = t.ddp if t.ddp is not None else compiled_forward(t.model, t.tc.compile, t.device, announce=t.main)


def _train_step(t: _Training) -> float:
    """One training step: its learning rate, its micro-batches, dropout seeded by the step, the optimiser
    step (train_step) and the step's loss into the segment's sums; returns the learning rate."""
    lr = set_lr(t.opt, t.tc, t.step, t.source.total)
    micro = t.source.batches(t.step)
    torch.manual_seed(step_seed(t.tc.seed, t.step))  # dropout
    step_loss, n_step = train_step(t.forward, micro, t.opt, t.scaler, precision=t.precision, device=t.device,
                                   grad_clip=t.tc.grad_clip, weights=t.source.weights, ddp=t.ddp, ema=t.ema,
                                   step=t.step, params=t.params)
    t.step += 1
    t.meter.add(dist_.all_reduce_mean(step_loss).item(), n_step)
    return lr


def _log_step(t: _Training, lr: float, bar) -> None:
    """A "step" row (rank 0): the window's mean train loss since the last one, the learning rate, the
    samples per second and the wall time trained; the window starts again."""
    synchronize(t.device)
    now = time.perf_counter()
    rate = t.meter.win_steps * t.source.samples_per_step / max(now - t.meter.t_log, 1e-9)
    if t.main:
        t.log.write(dict(kind="step", step=t.step, **t.source.segment(t.step - 1), lr=lr,
                         **{TRAIN_LOSS: t.meter.window_loss}, samples_per_s=round(rate, 1),
                         **t.source.rate_fields(rate),
                         wall=round(t.train_seconds + now - t.meter.t_seg, 3)))
    bar.set_postfix(loss=f"{t.meter.window_loss:.3f}", lr=f"{lr:.2e}")
    t.meter.logged(now)


def _evaluation_point(t: _Training) -> None:
    """At one of the source's evaluation points: the segment's seconds counted, the evaluation, the best
    weights so far kept (keep_best_val); on rank 0 its row, at the run's end the kept weights scored, and
    a checkpoint. The segment then starts again: windows restart at every checkpoint, so a resumed run
    logs exactly what an uninterrupted one does."""
    synchronize(t.device)
    seconds = time.perf_counter() - t.meter.t_seg
    t.train_seconds += seconds
    row, eval_seconds = _evaluate(t)
    weights = checkpoint_weights(t.model, t.ema)
    _keep_best(t, row, weights)
    if t.main:
        _log_evaluation(t, row, seconds, eval_seconds)
        if t.best is not None and t.step == t.source.total:   # the finished run's model: the best weights
            weights = _score_best(t, row, weights)
        _checkpoint(t, weights)
    dist_.barrier()
    t.meter.restart(t.step)


def _evaluate(t: _Training) -> tuple[dict, float]:
    """The evaluation at this step, of the EMA's weights where there is one (every rank evaluates; rank 0
    logs); under test_every shard the test CE only at each shard's last evaluation and the final one, under
    final at the final one only (validation at all). Returns its row and its seconds."""
    t_eval = time.perf_counter()
    final = t.step == t.source.total
    test = {} if t.tc.test_every == "evaluation" else dict(test=final or (
        t.tc.test_every == "shard" and t.source.segment(t.step - 1)["epoch"] == t.tc.epochs_per_shard - 1))
    with t.ema.applied() if t.ema is not None else contextlib.nullcontext():
        row = t.evaluate(t.model, t.precision, final=final, **test)
    return row, time.perf_counter() - t_eval


def _keep_best(t: _Training, row: dict, weights: dict) -> None:
    """keep_best_val: the evaluation's trainable weights (the fixed are the model's) become the best when
    its validation loss is below the best's."""
    if t.tc.keep_best_val and (t.best is None or row[VAL_LOSS] < t.best[VAL_LOSS]):
        t.best = dict(step=t.step, **{VAL_LOSS: row[VAL_LOSS]},
                      model={k: v.detach().clone() for k, v in only_trainable(t.model, weights["model"]).items()})


def _log_evaluation(t: _Training, row: dict, seconds: float, eval_seconds: float) -> None:
    """The "eval" row: the segment's train loss and speed, the evaluation's figures and times; and its
    line on the terminal."""
    seg = t.source.segment(t.step - 1)
    t.log.write(dict(kind="eval", step=t.step, **seg, **{TRAIN_LOSS: t.meter.train_loss}, **row,
                     samples_per_s=round((t.step - t.meter.start) * t.source.samples_per_step / max(seconds, 1e-9), 1),
                     seconds=round(seconds, 3), wall=round(t.train_seconds, 3),
                     eval_seconds=round(eval_seconds, 3)))
    first = next(iter(row))
    say(f"step {t.step}/{t.source.total}" + "".join(f" {k} {v}" for k, v in seg.items())
        + f": train {t.meter.train_loss:.4f}  {first} {row[first]:.4f} nats "
        f"({bits(row[first]):.3f} bits)", enabled=t.progress)


def _score_best(t: _Training, row: dict, weights: dict) -> dict:
    """The end-of-run scoring of keep_best_val: the best evaluation's weights scored in full (the last
    evaluation's row when they are the last's), logged as the "weights" row. Returns the checkpoint's
    weights with the best as the model and the last weights as `last`."""
    t_eval = time.perf_counter()
    kept = row if t.best["step"] == t.step else _score(t.model, t.best["model"], t.evaluate, t.precision)
    t.log.write(dict(kind="weights", step=t.best["step"], **kept,
                     eval_seconds=round(time.perf_counter() - t_eval, 3)))
    return dict(weights, model={**weights["model"], **t.best["model"]}, last=weights["model"])


def _checkpoint(t: _Training, weights: dict | None = None, **segment) -> None:
    """A checkpoint of where training stands (atomically): the weights (default: the model's, and the
    EMA's), the optimiser, scaler and sampler states, the step, the seconds trained, the log rows seen,
    the best evaluation's weights and the `segment`'s running sums when it is written between evaluations."""
    save_checkpoint(t.run_dir, dict(**(weights or checkpoint_weights(t.model, t.ema)), optimizer=t.opt.state_dict(),
                                    scaler=t.scaler.state_dict(), step=t.step, train_seconds=t.train_seconds,
                                    metrics_rows=t.log.rows, sampler=_sampler_state(t.source), best=t.best,
                                    device=device_name(t.device), window_step=t.window_step, **segment))


def _say_if_step_changed(t: _Training, ck: dict | None) -> None:
    """A run resumed on another window step than its checkpoint was written on says, in one line, that it
    goes on as another computation: the two steps draw dropout differently and round differently, so it
    will not equal the uninterrupted run (the checkpoint itself fits either)."""
    before = (ck or {}).get("window_step")
    if t.main and before and before != t.window_step and t.step > 0:
        say(f"reslm: warning: step {t.step:,} was reached on the {before} window step and the run goes on on the "
            f"{t.window_step} one: from here it will not equal the uninterrupted run (--window-step {before} "
            "continues it as it began, where that step can run)")


def _resume(t: _Training, ck: dict | None) -> None:
    """Where training stands, from the run's checkpoint `ck`: the step, the seconds trained, the
    segment's Meter and the best evaluation, with the model, EMA, optimiser, scaler and sampler state
    loaded and metrics.jsonl cut back to the rows the checkpoint had seen; without a checkpoint, step 0
    (and a log begun before it is started afresh)."""
    if ck is None:
        if t.main and t.log.rows:   # metrics without a checkpoint: an interrupted start, begin afresh
            t.log.truncate(0)
        t.meter = Meter()
        if t.tc.continue_from:   # the first start of a continued run: the source's weights, rows and step
            t.step, t.train_seconds = continuation.begin(t.run_dir, read_config(t.run_dir), t.model, t.source, t.log)
            t.meter = Meter(start=t.step)
            t.source.logged_states = {(r.get("cycle"), r.get("shard"), r.get("part"))
                                      for r in read_metrics(t.run_dir, "states")}
            _checkpoint(t)   # a later start resumes from here, as any run
        return
    try:
        last = ck.get("last", ck["model"])   # a finished keep_best_val run's "model" is its best
        t.model.load_state_dict(with_fixed(t.model, ck["raw"]) if t.ema is not None else last)
        if t.ema is not None:
            t.ema.load(last)
        t.opt.load_state_dict(ck["optimizer"])
        t.scaler.load_state_dict(ck["scaler"])
        t.step, t.train_seconds = int(ck["step"]), float(ck["train_seconds"])
        t.meter = Meter(**{"start": t.step, **ck.get("segment", {})})
        if hasattr(t.source, "load_state_dict"):   # e.g. a stream-mode model's carried state
            t.source.load_state_dict(ck.get("sampler", {}))
    except (RuntimeError, KeyError, ValueError, TypeError) as e:
        raise ReslmError(f"the checkpoint in {t.run_dir} does not fit its config: "
                         f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
    if t.main:   # the rows the checkpoint had seen (fewer on disk: an error), and which states they logged
        t.source.logged_states = {(r.get("cycle"), r.get("shard"), r.get("part"))
                                  for r in t.log.truncate(int(ck["metrics_rows"])) if r.get("kind") == "states"}
    t.best = ck.get("best")   # keep_best_val: {step, val_loss, model} of the best evaluation so far


def _train_ridge(run_dir: Path, cfg: dict, model, source, log: MetricsLog, precision: str, progress: bool) -> dict:
    """A ridge or lbfgs run: one pass and solve (SOLVERS), one test evaluation, one checkpoint (step 1).
    A finished run is only summarised again; an interrupted one (no checkpoint) starts afresh."""
    ck = load_checkpoint(run_dir, map_location=source.device)
    if ck is not None:
        try:
            model.load_state_dict(ck["model"])
        except (RuntimeError, KeyError) as e:
            raise ReslmError(f"the checkpoint in {run_dir} does not fit its config: "
                             f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
        log.truncate(int(ck["metrics_rows"]))
        return summarize(run_dir, model, cfg, source, extra=ck.get("ridge", {}))   # lbfgs's info too
    log.truncate(0)
    t0 = time.perf_counter()
    info = SOLVERS[source.tc.optimizer](model, source, source.tc, log=log, progress=progress)
    synchronize(source.device)
    seconds = time.perf_counter() - t0      # states of the training shards included, as in the Adam loop
    row = source.evaluate(model, precision, final=True)
    log.write(dict(kind="eval", step=1, **info, **row, seconds=round(seconds, 3), wall=round(seconds, 3)))
    chosen = (f"alpha {info['ridge_alpha']:.0e}, temperature {info['temperature']:.4g}" if "ridge_alpha" in info
              else f"l2 {info['lbfgs_l2']:.0e}, train {info[LBFGS_TRAIN_LOSS]:.4f}")
    say(f"{source.tc.optimizer}: {chosen}, held-out {info[HELDOUT_LOSS]:.4f}, test {row[TEST_LOSS]:.4f} nats "
        f"({row[TEST_BPC]:.3f} bits) in {seconds:.1f} s", enabled=progress)
    save_checkpoint(run_dir, dict(model=model.state_dict(), step=1, train_seconds=seconds, metrics_rows=log.rows,
                                  ridge=info))
    return summarize(run_dir, model, cfg, source, extra=info)
