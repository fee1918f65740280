"""Character-level training, the paper's protocol (section "Training", "Dataset and Methodology"):

    for cycle in 1..C:                       (a full pass over the five training shards)
        for shard in training shards:
            features = model.features(shard)          reservoir states computed once per shard
            for epoch in 1..E:                        E = 5 shard-epochs (paper)
                Adam steps over shuffled batches of 1024 samples (lr 1e-4, cross-entropy)
                test cross-entropy on the test shard  (nats and bits per character)
                checkpoint

Every shard-epoch draws its shuffle and dropout from a seed derived from (seed, its index in the
schedule), so a resumed run is the same computation as an uninterrupted one.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from tqdm.auto import tqdm

from reslm.data import CharDataset
from reslm.device import (PRECISIONS, grad_scaler, pick_device, resolve_precision, setup_cuda, state_dtype,
                          synchronize)
from reslm.device import autocast as autocast_ctx
from reslm.errors import ReslmError
from reslm.evaluate import bits, cross_entropy
from reslm.models import build_model, make_config
from reslm.models.base import count_params
from reslm.run import MetricsLog, load_checkpoint, read_config, read_metrics, save_checkpoint, write_json


@dataclass
class TrainConfig:
    lr: float = 1e-4                # Adam learning rate (paper)
    batch_size: int = 1024          # samples per step (paper)
    epochs_per_shard: int = 5       # E: epochs on a shard before the next (paper)
    cycles: int = 1                 # C: passes over the training shards
    epoch_samples: int = 0          # samples per shard-epoch, a fresh random subset each time; 0 = all
    shard_chars: int = 0            # use only the first K characters of each training shard; 0 = all
    eval_samples: int = 0           # test samples per evaluation (8 evenly spread blocks); 0 = whole test shard
    log_every: int = 100            # steps between "step" rows in metrics.jsonl
    seed: int = 0                   # shuffling and dropout (model weights have their own seed field)
    device: str = "auto"            # auto | cpu | cuda | cuda:N
    precision: str = "auto"         # auto | fp32 | bf16 | fp16
    state_dtype: str = "float32"    # reservoir states: float32 | bfloat16
    threads: int = 0                # torch CPU threads; 0 = torch's default

    def validate(self):
        for name in ("lr", "batch_size", "epochs_per_shard", "cycles", "log_every"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ReslmError(f"{name} must be > 0, got {v}")
        for name in ("epoch_samples", "shard_chars", "eval_samples", "threads"):
            if getattr(self, name) < 0:
                raise ReslmError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.precision not in PRECISIONS:
            raise ReslmError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        state_dtype(self.state_dtype)


def train_fields() -> set[str]:
    return {f.name for f in fields(TrainConfig)}


def make_run_config(family: str, model_overrides: dict, train_overrides: dict, dataset: CharDataset,
                    preset: str | None = None) -> dict:
    """Resolve and validate everything a run needs, before anything is written."""
    vocab = dataset.vocab_size
    if model_overrides.get("vocab_size", vocab) != vocab:
        raise ReslmError(f"vocab_size {model_overrides['vocab_size']} does not match the dataset's {vocab}")
    model_cfg = make_config(family, **{**model_overrides, "vocab_size": vocab})
    unknown = sorted(set(train_overrides) - train_fields())
    if unknown:
        raise ReslmError(f"unknown training option(s): {', '.join(unknown)}")
    train_cfg = TrainConfig(**train_overrides)
    train_cfg.validate()
    shortest = min(e - s for s, e in dataset.shards)
    if model_cfg.context >= shortest:
        raise ReslmError(f"context {model_cfg.context} is not shorter than the smallest shard ({shortest} chars)")
    if 0 < train_cfg.shard_chars <= model_cfg.context:
        raise ReslmError(f"shard_chars {train_cfg.shard_chars} must exceed the context ({model_cfg.context})")
    import reslm
    return dict(family=family, preset=preset, model=asdict(model_cfg), train=asdict(train_cfg),
                data=dict(path=str(Path(dataset.path).resolve()), name=dataset.name, vocab=dataset.vocab,
                          shards=dataset.shards, train_shards=dataset.train_shards,
                          test_shard=dataset.test_shard),
                versions=dict(reslm=reslm.__version__, torch=torch.__version__))


def load_model(cfg: dict, device="cpu"):
    """Build the model a run config describes (weights not loaded)."""
    family = cfg["family"]
    return build_model(family, make_config(family, **cfg["model"])).to(device)


def schedule(tc: TrainConfig, train_shards: list[int]) -> list[tuple[int, int, int]]:
    """The shard-epochs in order: (cycle, shard, epoch)."""
    return [(c, s, e) for c in range(tc.cycles) for s in train_shards for e in range(tc.epochs_per_shard)]


def eval_slices(n_tokens: int, context: int, eval_samples: int, blocks: int = 8) -> list[slice]:
    """Token slices of the test stream to evaluate on: all of it, or `blocks` evenly spread blocks
    holding `eval_samples` samples in total (each block brings its own `context` tokens)."""
    if eval_samples == 0 or eval_samples >= n_tokens - context:
        return [slice(0, n_tokens)]
    per = max(1, eval_samples // blocks)
    span = n_tokens - (per + context)
    return [slice(a, a + per + context) for a in (span * i // max(1, blocks - 1) for i in range(blocks))]


def _available_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def train_run(run_dir: Path, *, progress: bool = True) -> dict:
    """Train (or continue training) the run in run_dir; returns the final summary."""
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    tc = TrainConfig(**cfg["train"])
    tc.validate()
    dataset = CharDataset.load(cfg["data"]["path"])
    if dataset.vocab != cfg["data"]["vocab"]:
        raise ReslmError(f"the dataset at {dataset.path} no longer has the vocabulary this run was made with")
    if tc.threads:
        torch.set_num_threads(tc.threads)
    device = pick_device(tc.device)
    precision = resolve_precision(tc.precision, device)
    setup_cuda()
    sdtype = state_dtype(tc.state_dtype)
    model = load_model(cfg, device)
    context = model.config.context
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=tc.lr)
    scaler = grad_scaler(precision, device)
    log = MetricsLog(run_dir)

    plan = schedule(tc, dataset.train_shards)
    start, step, train_seconds = 0, 0, 0.0
    ck = load_checkpoint(run_dir, map_location=device)
    if ck is not None:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        scaler.load_state_dict(ck["scaler"])
        start, step, train_seconds = ck["position"], ck["step"], ck["train_seconds"]
        log.truncate(ck["metrics_rows"])
    if start >= len(plan):
        return _summary(run_dir, model, cfg)

    def tokens_of(shard: int) -> torch.Tensor:
        a, b = dataset.shards[shard]
        if shard != dataset.test_shard and tc.shard_chars:
            b = min(b, a + tc.shard_chars)
        return torch.from_numpy(dataset.tokens[a:b].astype("int64")).to(device)

    # Memory: a reservoir model holds one training shard's states plus the test states.
    if hasattr(model, "reservoir"):
        longest = max(b - a for a, b in dataset.shards)
        longest = min(longest, tc.shard_chars or longest)
        n_test = sum(s.stop - s.start - context for s in
                     eval_slices(dataset.shards[dataset.test_shard][1] - dataset.shards[dataset.test_shard][0],
                                 context, tc.eval_samples))
        row = model.reservoir.size * sdtype.itemsize                      # bytes per state
        need = (longest + n_test) * row
        avail = _available_memory(device)
        if avail is not None and need > 0.9 * avail:
            fits = int(0.9 * avail / row) - longest                         # test samples that would fit
            hint = f"--eval-samples {fits // 1000 * 1000}" if fits >= 1000 else "a smaller reservoir"
            raise ReslmError(f"reservoir states need {need / 2**30:.1f} GiB (train shard + test states) but "
                             f"{avail / 2**30:.1f} GiB is available: use --state-dtype bfloat16 or {hint}")

    test_tokens = tokens_of(dataset.test_shard)
    test_feats = [model.features(test_tokens[s], dtype=sdtype, progress=progress)
                  for s in eval_slices(test_tokens.numel(), context, tc.eval_samples)]
    feats, feats_shard = None, None
    model.train()
    for k in range(start, len(plan)):
        cycle, shard, epoch = plan[k]
        if feats_shard != shard:
            feats = None  # free the previous shard's states first
            t0 = time.perf_counter()
            feats = model.features(tokens_of(shard), dtype=sdtype, progress=progress)
            synchronize(device)
            dt = time.perf_counter() - t0
            log.write(dict(kind="states", cycle=cycle, shard=shard, seconds=round(dt, 4),
                           tokens_per_s=round(len(feats) / dt, 1)))
            feats_shard = shard
        gen = torch.Generator().manual_seed(tc.seed * 1_000_003 + k)
        torch.manual_seed(tc.seed * 1_000_003 + k)  # dropout
        order = torch.randperm(len(feats), generator=gen)
        if tc.epoch_samples:
            order = order[:tc.epoch_samples]
        order = order.to(device)
        batches = order.split(tc.batch_size)
        bar = tqdm(batches, desc=f"cycle {cycle + 1}/{tc.cycles} shard {shard} epoch {epoch + 1}/{tc.epochs_per_shard}",
                   disable=not progress, leave=False, unit="batch")
        epoch_loss, window_loss, window_n, t_window = 0.0, 0.0, 0, time.perf_counter()
        t_epoch = time.perf_counter()
        for index in bar:
            x, y = feats.batch(index), feats.targets[index]
            with autocast_ctx(precision, device):
                _, loss = model.forward_features(x, y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            step += 1
            lv = loss.item()
            epoch_loss += lv * y.numel()
            window_loss += lv
            window_n += 1
            if step % tc.log_every == 0:
                now = time.perf_counter()
                sps = window_n * tc.batch_size / (now - t_window)
                log.write(dict(kind="step", step=step, cycle=cycle, shard=shard, epoch=epoch,
                               train_loss=window_loss / window_n, samples_per_s=round(sps, 1),
                               wall=round(train_seconds + now - t_epoch, 3)))
                bar.set_postfix(loss=f"{window_loss / window_n:.3f}", samples_s=f"{sps:,.0f}")
                window_loss, window_n, t_window = 0.0, 0, now
        synchronize(device)
        epoch_seconds = time.perf_counter() - t_epoch
        train_seconds += epoch_seconds
        test_loss = cross_entropy(model, test_feats, batch_size=tc.batch_size, device=device, precision=precision)
        train_loss = epoch_loss / max(1, order.numel())
        log.write(dict(kind="epoch", index=k, step=step, cycle=cycle, shard=shard, epoch=epoch,
                       train_loss=train_loss, test_loss=test_loss, test_bpc=bits(test_loss),
                       samples_per_s=round(order.numel() / epoch_seconds, 1), epoch_seconds=round(epoch_seconds, 3),
                       wall=round(train_seconds, 3)))
        if progress:
            tqdm.write(f"cycle {cycle + 1} shard {shard} epoch {epoch + 1}: train {train_loss:.4f}  "
                       f"test {test_loss:.4f} nats ({bits(test_loss):.3f} bpc)  "
                       f"{order.numel() / epoch_seconds:,.0f} samples/s")
        save_checkpoint(run_dir, dict(model=model.state_dict(), optimizer=opt.state_dict(),
                                      scaler=scaler.state_dict(), position=k + 1, step=step,
                                      train_seconds=train_seconds, metrics_rows=log.rows))
    return _summary(run_dir, model, cfg)


def _summary(run_dir: Path, model, cfg: dict) -> dict:
    """Final figures of a run (also written to summary.json)."""
    rows = read_metrics(run_dir)
    epochs = [r for r in rows if r["kind"] == "epoch"]
    trainable, fixed = count_params(model)
    last = epochs[-1] if epochs else {}
    summary = dict(family=cfg["family"], preset=cfg.get("preset"), trainable_params=trainable,
                   fixed_params=fixed, shard_epochs=len(epochs), steps=last.get("step", 0),
                   final_train_loss=last.get("train_loss"), final_test_loss=last.get("test_loss"),
                   final_test_bpc=last.get("test_bpc"),
                   best_test_loss=min((r["test_loss"] for r in epochs), default=None),
                   train_seconds=last.get("wall"),
                   reservoir_seconds=round(sum(r["seconds"] for r in rows if r["kind"] == "states"), 3))
    write_json(Path(run_dir) / "summary.json", summary)
    return summary
