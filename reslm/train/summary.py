"""What a trained run writes last: summary.json (its figures: losses in nats and bits, the held-out
and test scores, timings), from the run's metrics, model and sampler (reslm.train.loop)."""
from __future__ import annotations

from pathlib import Path

from reslm.core.files import write_json
from reslm.core.metrics import (MIN_TRAIN_LOSS, SPLIT_FIGURES, TEST_LOSS, TEST_LOSS_AT_BEST_VAL, TRAIN_LOSS, VAL_LOSS,
                                best_of, final_of, kept_of)
from reslm.models.base import count_params
from reslm.models.budget import check_frontier
from reslm.run import SUMMARY, read_metrics, schedule_key
from reslm.train.continuation import continued_row

def summarize(run_dir: Path, model, cfg: dict, source, extra: dict | None = None, eval_kind: str | None = None) -> dict:
    """Final figures of a run from its metrics (also written to summary.json), plus `extra`; the
    evaluations are the source's (`test`, `val`) unless eval_kind says otherwise (`heldout`)."""
    kind = eval_kind or source.eval_kind
    rows = read_metrics(run_dir)
    steps = [r for r in rows if r["kind"] == "step"]
    evals = [r for r in rows if r["kind"] == "eval" and r["step"] > 0]
    trainable, fixed = count_params(model)
    last = evals[-1] if evals else {}
    key = SPLIT_FIGURES[kind][0]
    summary = dict(family=cfg["family"], preset=cfg.get("preset"), trainable_params=trainable, fixed_params=fixed,
                   steps=last.get("step", 0), finished=last.get("step", 0) >= source.total,
                   schedule=schedule_key(cfg),
                   frontier=check_frontier(model).ok,   # the strict reservoir-family rules (models.budget)
                   evaluations=len(evals), **{final_of(TRAIN_LOSS): last.get(TRAIN_LOSS)},
                   # over every logged train loss: the step rows' windows and the evaluations' segment means
                   # (whose last is final_train_loss), so it is never above final_train_loss
                   **{MIN_TRAIN_LOSS: min((r[TRAIN_LOSS] for r in steps + evals
                                       if isinstance(r.get(TRAIN_LOSS), (int, float))), default=None)})
    for k, v in last.items():
        if k.startswith(kind):
            summary[final_of(k)] = v
    summary[best_of(key)] = min((r[key] for r in evals if key in r), default=None)   # test_every shard: not every row
    scored = [r for r in evals if isinstance(r.get(VAL_LOSS), (int, float))]
    if kind == "test" and scored:   # a validation split: what selection on it gives
        best = min(scored, key=lambda r: r[VAL_LOSS])
        summary.update(**{final_of(VAL_LOSS): scored[-1][VAL_LOSS], best_of(VAL_LOSS): best[VAL_LOSS]},
                       best_val_step=best["step"], **{TEST_LOSS_AT_BEST_VAL: best.get(TEST_LOSS)},
                       selection="validation")
    # wall times are per attempt (a resumed run's differ from an uninterrupted one's); every other figure
    # of the log and summary is the same. reservoir_seconds: the time of each shard's first computation
    kept = next((r for r in rows if r["kind"] == "weights"), None)
    if kept:   # keep_best_val: the model is the best-on-validation evaluation's, scored again at the end
        summary.update(weights="best-val", weights_step=kept["step"],
                       **{kept_of(k): v for k, v in kept.items() if k.startswith(("test_", "val_"))})
    continued = continued_row(rows)
    if continued:   # trained on from a published run's weights with a fresh optimiser state (continue_from)
        summary["continued_from"] = {k: continued[k] for k in ("run", "step", "cycles", "optimizer")}
    summary["train_seconds"] = last.get("wall")
    timed = [r["eval_seconds"] for r in rows if r["kind"] in ("eval", "weights") and "eval_seconds" in r]
    summary["eval_seconds"] = round(sum(timed), 3) if timed else None   # every evaluation's time, the kept weights' scoring included
    summary["reservoir_seconds"] = round(sum(r["seconds"] for r in rows if r["kind"] == "states"), 3)
    summary.update(source.summary_fields(cfg, summary["steps"]))
    summary.update(extra or {})
    write_json(Path(run_dir) / SUMMARY, summary)
    return summary


