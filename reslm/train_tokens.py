"""Token-level training of LAERC / GPT on a BPE TokenDataset (paper Appendix A.3 defaults).

    for step k in 0..max_steps-1:
        lr(k): linear warmup over warmup_steps, hold for hold_steps, cosine to lr * min_lr_frac at max_steps
        grad_accum micro-batches of micro_batch random windows of `context` tokens from train.bin
        (drawn from a generator seeded by (seed, k), so a resumed run is the same computation)
        AdamW (weight decay on linear weight matrices only), gradient clipping, bf16/fp16 autocast
        every eval_every steps and at the end: mean CE over eval_batches fixed-seed val batches,
        then an atomic checkpoint

The run directory is the one reslm.run describes (config.json, metrics.jsonl, checkpoint.pt,
summary.json); `create_token_run` validates everything before the directory appears.

Under `torchrun --nproc_per_node=K` (reslm.distributed) the model is wrapped in DistributedDataParallel:
each step's micro_batch windows are drawn exactly as in one process and rank r trains on rows
[r*b, (r+1)*b) of them (b = micro_batch // K), so K ranks see the same samples as one process and follow
the same trajectory (up to float reduction order). Only rank 0 writes metrics, checkpoints and the
summary; checkpoints hold the unwrapped model, so a run can be resumed with any K. `create_token_run`
is rank-safe too: rank 0 creates the directory while the others wait.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from reslm import distributed as dist_
from reslm.data.bpe import TokenDataset
from reslm.device import PRECISIONS, grad_scaler, pick_device, resolve_precision, setup_cuda, synchronize
from reslm.device import autocast as autocast_ctx
from reslm.errors import ReslmError
from reslm.evaluate import bits
from reslm.models.base import build_config, count_params
from reslm.models.gpt import GPT, GPTConfig
from reslm.models.laerc import LAERC, LAERCConfig
from reslm.run import (MetricsLog, create_run_dir, load_checkpoint, read_config, read_metrics, save_checkpoint,
                       write_json)

FAMILIES = {"laerc": (LAERC, LAERCConfig), "gpt": (GPT, GPTConfig)}
_EVAL_SEED = 0x5EED_E7A1


@dataclass
class TokenTrainConfig:
    lr: float = 6e-4                # peak learning rate
    min_lr_frac: float = 0.1        # cosine floor = lr * min_lr_frac
    warmup_steps: int = 100         # linear warmup
    hold_steps: int = 0             # constant lr after warmup, before the cosine
    max_steps: int = 1000           # optimizer steps in all
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.1       # linear weight matrices only
    grad_clip: float = 1.0          # max global grad norm; 0 = no clipping
    micro_batch: int = 32           # windows per forward/backward
    grad_accum: int = 4             # micro-batches per optimizer step
    context: int = 512              # T: window length (<= the model's context)
    eval_every: int = 100           # steps between evaluations (+ checkpoints)
    eval_batches: int = 20          # val batches (of micro_batch windows) per evaluation
    log_every: int = 10             # steps between "step" rows
    seed: int = 0                   # batch sampling and dropout
    device: str = "auto"            # auto | cpu | cuda | cuda:N
    precision: str = "auto"         # auto | fp32 | bf16 | fp16
    threads: int = 0                # torch CPU threads; 0 = torch's default

    def validate(self) -> "TokenTrainConfig":
        for name in ("warmup_steps", "hold_steps", "max_steps", "micro_batch", "grad_accum", "context",
                     "eval_every", "eval_batches", "log_every", "seed", "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ReslmError(f"{name} must be an integer, got {v!r}")
        for name in ("max_steps", "micro_batch", "grad_accum", "context", "eval_every", "eval_batches", "log_every"):
            if getattr(self, name) <= 0:
                raise ReslmError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("warmup_steps", "hold_steps", "threads", "seed"):
            if getattr(self, name) < 0:
                raise ReslmError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "min_lr_frac", "beta1", "beta2", "weight_decay", "grad_clip"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
                raise ReslmError(f"{name} must be a finite number, got {v!r}")
        if self.lr <= 0:
            raise ReslmError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_frac <= 1:
            raise ReslmError(f"min_lr_frac must be in [0, 1], got {self.min_lr_frac}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ReslmError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ReslmError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.precision not in PRECISIONS:
            raise ReslmError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not isinstance(self.device, str):
            raise ReslmError(f"device must be a string, got {self.device!r}")
        return self


def token_train_fields() -> set[str]:
    return {f.name for f in fields(TokenTrainConfig)}


def lr_at(tc: TokenTrainConfig, step: int) -> float:
    """Learning rate of optimizer step `step` (0-based): warmup, hold, cosine to lr * min_lr_frac."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    start = tc.warmup_steps + tc.hold_steps
    if step < start:
        return tc.lr
    span = max(1, tc.max_steps - start)
    progress = min(1.0, (step - start) / span)
    floor = tc.lr * tc.min_lr_frac
    return floor + (tc.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def token_batch(data, batch: int, context: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` random windows of context+1 tokens: x = chunk[:-1], y = chunk[1:], (batch, context) int64."""
    n = len(data)
    if n <= context:
        raise ReslmError(f"context {context} is not shorter than the data ({n} tokens)")
    offsets = torch.randint(0, n - context, (batch,), generator=generator).tolist()
    chunks = torch.from_numpy(np.stack([np.asarray(data[o:o + context + 1], dtype=np.int64) for o in offsets]))
    return chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous()


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on nn.Linear weight matrices; none on biases, LayerNorms, embeddings
    (also when tied to the output), positional tables and scalars."""
    decay_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad}
    decay, no_decay, seen = [], [], set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if id(p) in decay_ids else no_decay).append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


def build_token_model(family: str, model: dict) -> nn.Module:
    if family not in FAMILIES:
        raise ReslmError(f"unknown family {family!r} (use {' or '.join(FAMILIES)})")
    cls, cfg_cls = FAMILIES[family]
    return cls(build_config(cfg_cls, model, family))


def make_token_run_config(family: str, model_overrides: dict, train_overrides: dict,
                          dataset: TokenDataset) -> dict:
    """Resolve and validate everything a token run needs, before anything is written."""
    if family not in FAMILIES:
        raise ReslmError(f"unknown family {family!r} (use {' or '.join(FAMILIES)})")
    vocab = dataset.vocab_size
    if model_overrides.get("vocab_size", vocab) != vocab:
        raise ReslmError(f"vocabulary mismatch: vocab_size {model_overrides['vocab_size']} but the dataset "
                         f"{dataset.name} has {vocab}")
    model_cfg = build_config(FAMILIES[family][1], {**model_overrides, "vocab_size": vocab}, family)
    unknown = sorted(set(train_overrides) - token_train_fields())
    if unknown:
        raise ReslmError(f"unknown training option(s): {', '.join(unknown)}")
    train_cfg = TokenTrainConfig(**train_overrides).validate()
    if train_cfg.context > model_cfg.context:
        raise ReslmError(f"training context {train_cfg.context} is longer than the model's context "
                         f"({model_cfg.context})")
    for split in ("train", "val"):
        n = dataset.n_tokens[split]
        if train_cfg.context >= n:
            raise ReslmError(f"context {train_cfg.context} is not shorter than the {split} split "
                             f"({n} tokens)")
    import reslm
    return dict(family=family, preset=None, model=asdict(model_cfg), train=asdict(train_cfg),
                data=dict(path=str(Path(dataset.path).resolve()), name=dataset.name, vocab_size=vocab,
                          kind="tokens"),
                versions=dict(reslm=reslm.__version__, torch=torch.__version__))


def create_token_run(out: Path, family: str, model_overrides: dict, train_overrides: dict,
                     dataset: TokenDataset) -> Path:
    """Validate, then create the run directory (config.json only). Under torchrun, rank 0 creates it and
    the other ranks wait for it (and fail with rank 0's error when it could not be made)."""
    _, world, _ = dist_.init(str(train_overrides.get("device", "auto")))
    if world == 1:
        return create_run_dir(Path(out), make_token_run_config(family, model_overrides, train_overrides, dataset))
    err = None
    if dist_.is_main():
        try:
            create_run_dir(Path(out), make_token_run_config(family, model_overrides, train_overrides, dataset))
        except Exception as e:  # tell the other ranks before raising
            err = e
    if not dist_.all_ok(err is None):
        if err is not None:
            raise err
        raise ReslmError(f"rank 0 could not create the run directory {out}")
    return Path(out)


@torch.no_grad()
def val_loss(model, data, tc: TokenTrainConfig, device, precision: str) -> float:
    """Mean CE (nats) over eval_batches fixed-seed batches of micro_batch windows."""
    gen = torch.Generator().manual_seed(_EVAL_SEED + tc.seed)
    was_training = model.training
    model.eval()
    total = 0.0
    for _ in range(tc.eval_batches):
        x, y = token_batch(data, tc.micro_batch, tc.context, gen)
        with autocast_ctx(precision, device):
            _, loss = model(x.to(device), y.to(device))
        total += loss.float().item()
    model.train(was_training)
    return total / tc.eval_batches


def train_token_run(run_dir: Path, progress: bool = True, stop_at: int | None = None) -> dict:
    """Train (or continue training) the token run in run_dir; returns the final summary.

    `stop_at`: stop (after an evaluation and a checkpoint) once this many steps are done, short of
    max_steps; a later call resumes. Under torchrun every rank calls this (see the module doc)."""
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    tc = TokenTrainConfig(**cfg["train"]).validate()
    rank, world, local_rank = dist_.init(tc.device)
    main = rank == 0
    if tc.micro_batch % world:
        raise ReslmError(f"micro_batch {tc.micro_batch} is not divisible by the number of processes ({world})")
    rows = slice(rank * (tc.micro_batch // world), (rank + 1) * (tc.micro_batch // world))
    dataset = TokenDataset.load(cfg["data"]["path"])
    if dataset.vocab_size != cfg["data"]["vocab_size"]:
        raise ReslmError(f"vocabulary mismatch: the dataset at {dataset.path} has {dataset.vocab_size} tokens, "
                         f"this run was made with {cfg['data']['vocab_size']}")
    if tc.threads:
        torch.set_num_threads(tc.threads)
    device = pick_device(tc.device)
    if world > 1 and device.type == "cuda":
        device = torch.device("cuda", local_rank)
    precision = resolve_precision(tc.precision, device)
    setup_cuda()
    model = build_token_model(cfg["family"], cfg["model"]).to(device)
    opt = torch.optim.AdamW(param_groups(model, tc.weight_decay), lr=tc.lr, betas=(tc.beta1, tc.beta2),
                            **({"fused": True} if device.type == "cuda" else {}))
    scaler = grad_scaler(precision, device)
    log = MetricsLog(run_dir) if main else None
    train_data, val_data = dataset.train, dataset.val

    step, train_seconds = 0, 0.0
    ck = load_checkpoint(run_dir, map_location=device)
    if ck is not None:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        scaler.load_state_dict(ck["scaler"])
        step, train_seconds = int(ck["step"]), float(ck["train_seconds"])
        if main:
            log.truncate(int(ck["metrics_rows"]))
    elif main and log.rows:  # metrics without a checkpoint: an interrupted start, begin afresh
        log.truncate(0)
    # DDP wraps the model for the training forward/backward; evaluation and checkpoints use `model`.
    # A model with parameters that never get a gradient (LAERC's LN_res, which only feeds the no-grad
    # reservoir) says so, and DDP then looks for them each step instead of waiting for them forever.
    unused = bool(getattr(model, "has_unused_parameters", False))
    ddp = (torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                                     else None, find_unused_parameters=unused)
           if world > 1 else None)
    end = tc.max_steps if stop_at is None else max(0, min(tc.max_steps, stop_at))

    tokens_per_step = tc.micro_batch * tc.grad_accum * tc.context
    bar = None
    if progress and main and step < end:
        from tqdm.auto import tqdm
        bar = tqdm(total=tc.max_steps, initial=step, desc=f"{cfg['family']} tokens", unit="step")
    if ck is None:  # the untrained model's val loss, for reference (step 0)
        vl = val_loss(model, val_data, tc, device, precision)
        if main:
            log.write(dict(kind="eval", step=0, val_loss=vl, val_bits_per_token=bits(vl)))
    model.train()
    t_seg = time.perf_counter()   # wall clock since the last checkpoint
    t_log = t_seg
    while step < end:
        lr = lr_at(tc, step)
        for g in opt.param_groups:
            g["lr"] = lr
        gen = torch.Generator().manual_seed(tc.seed * 1_000_003 + step)
        torch.manual_seed(tc.seed * 1_000_003 + step)  # dropout
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for i in range(tc.grad_accum):
            x, y = token_batch(train_data, tc.micro_batch, tc.context, gen)  # the same draws on every rank
            if world > 1:
                x, y = x[rows], y[rows]
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            # DDP: average the gradients across ranks on the last micro-step only
            sync = contextlib.nullcontext() if ddp is None or i == tc.grad_accum - 1 else ddp.no_sync()
            with sync:
                with autocast_ctx(precision, device):
                    _, loss = (ddp or model)(x, y)
                scaler.scale(loss / tc.grad_accum).backward()
            step_loss += loss.detach().float()
        if tc.grad_clip > 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        scaler.step(opt)
        scaler.update()
        step += 1
        if bar is not None:
            bar.update(1)
        if step % tc.log_every == 0:
            train_loss = dist_.all_reduce_mean(step_loss).item() / tc.grad_accum
            synchronize(device)
            now = time.perf_counter()
            n_steps = tc.log_every
            if main:
                log.write(dict(kind="step", step=step, lr=lr, train_loss=train_loss,
                               tokens_per_s=round(n_steps * tokens_per_step / max(now - t_log, 1e-9), 1),
                               wall=round(train_seconds + now - t_seg, 3)))
            if bar is not None:
                bar.set_postfix(loss=f"{train_loss:.3f}", lr=f"{lr:.2e}")
            t_log = now
        if step % tc.eval_every == 0 or step == end:
            synchronize(device)
            now = time.perf_counter()
            train_seconds += now - t_seg
            # every rank evaluates the same (identical) model on the same val batches; rank 0 logs
            vl = val_loss(model, val_data, tc, device, precision)
            if main:
                log.write(dict(kind="eval", step=step, val_loss=vl, val_bits_per_token=bits(vl)))
                if bar is not None:
                    bar.write(f"step {step}: val {vl:.4f} nats ({bits(vl):.3f} bits/token)")
                save_checkpoint(run_dir, dict(model=model.state_dict(), optimizer=opt.state_dict(),
                                              scaler=scaler.state_dict(), step=step, train_seconds=train_seconds,
                                              metrics_rows=log.rows))
            dist_.barrier()
            t_seg = t_log = time.perf_counter()
    if bar is not None:
        bar.close()
    if world == 1:
        return _summary(run_dir, model, cfg, tc, train_seconds)
    summary = _summary(run_dir, model, cfg, tc, train_seconds) if main else None
    dist_.barrier()  # summary.json is written
    return summary if main else json.loads((run_dir / "summary.json").read_text())


def _summary(run_dir: Path, model, cfg: dict, tc: TokenTrainConfig, train_seconds: float) -> dict:
    rows = read_metrics(run_dir)
    steps = [r for r in rows if r["kind"] == "step"]
    evals = [r for r in rows if r["kind"] == "eval"]
    trainable, fixed = count_params(model)
    last_step = evals[-1]["step"] if evals else 0
    summary = dict(family=cfg["family"], trainable_params=trainable, fixed_params=fixed, steps=last_step,
                   min_train_loss=min((r["train_loss"] for r in steps), default=None),
                   final_val_loss=evals[-1]["val_loss"] if evals else None,
                   final_val_bits_per_token=evals[-1]["val_bits_per_token"] if evals else None,
                   best_val_loss=min((r["val_loss"] for r in evals), default=None),
                   tokens_seen=last_step * tc.micro_batch * tc.grad_accum * tc.context,
                   train_seconds=round(train_seconds, 3))
    write_json(Path(run_dir) / "summary.json", summary)
    return summary
