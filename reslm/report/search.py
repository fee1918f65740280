"""The outputs of a hyperparameter search (`reslm search`), from every trial in its optuna study.

    trials.csv          number, state, value, seconds, each parameter, error
    best.json           the best trial: value, parameters, model and training overrides, command
    best_command.txt    the best config as a ready `reslm train ...` command
    history.png         objective per trial and best so far (matplotlib; skipped with a note if missing)
    importance.png      parameter importances (optuna's PED-ANOVA evaluator; from 4 finished trials)
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import atomic_write, write_json
from reslm.core.metrics import HELDOUT_LOSS
from reslm.core.progress import say
from reslm.models.identity import command
from reslm.report.figures import _pyplot


def train_command(family: str, model: dict, train: dict, data: str, optimizer: str, out: str) -> str:
    """The `reslm train ...` command line of a trial's configuration (reslm.models.identity.command: the
    fields that differ from the family's defaults), its optimizer always named."""
    seed = model.get("seed", 0)
    cfg = dict(family=family, preset=None, model=model, train={**train, "optimizer": optimizer, "seed": seed},
               data=dict(name=data))
    return command(cfg, out=out, extra={"optimizer": optimizer})


def write_outputs(out: Path, study, family: str, optimizer: str, train_over: dict, dataset,
                  progress: bool = True) -> dict:
    """trials.csv, best.json, best_command.txt and the plots, from every trial in the study."""
    trials = study.trials
    params = sorted({k for t in trials for k in t.params})
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["number", "state", "value", "seconds", *params, "error"])
    for t in trials:
        w.writerow([t.number, t.state.name, "" if t.value is None else t.value, t.user_attrs.get("seconds", ""),
                    *[t.params.get(k, "") for k in params], t.user_attrs.get("error", "")])
    atomic_write(out / "trials.csv", lambda p: p.write_text(buf.getvalue()))
    finished = [t for t in trials if t.value is not None and t.state.name == "COMPLETE"]
    if not finished:
        raise ReslmError(f"no trial of study {study.study_name!r} finished (see {out / 'trials.csv'})")
    best = min(finished, key=lambda t: (t.value, t.number))
    model = best.user_attrs["model"]
    train = {k: v for k, v in train_over.items() if k != "device"}
    command = train_command(family, model, train, str(dataset.path), optimizer, f"runs/{study.study_name}-best")
    result = dict(study=study.study_name, trials=len(trials), finished=len(finished), best_trial=best.number,
                  **{HELDOUT_LOSS: best.value}, params=best.params, model=model, train={**train, "optimizer": optimizer},
                  **{k: best.user_attrs[k] for k in ("ridge_alpha", "temperature") if k in best.user_attrs},
                  command=command)
    write_json(out / "best.json", result)
    atomic_write(out / "best_command.txt", lambda p: p.write_text(command + "\n"))
    _plots(out, study, finished, progress)
    return result


def _plots(out: Path, study, finished, progress: bool) -> None:
    plt = _pyplot()
    if plt is None:
        say("reslm: matplotlib is not installed: no history or importance plots (pip install 'reslm[plot]')",
            enabled=progress)
        return
    import optuna   # an optional dependency (reslm[lab]): only a search has a study to plot

    def save(fig, name):
        atomic_write(out / name, lambda p: fig.savefig(p, format="png", dpi=110))
        plt.close(fig)

    nums = [t.number for t in finished]
    vals = [t.value for t in finished]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(nums, vals, "o", ms=4, label="trial")
    ax.plot(nums, [min(vals[:i + 1]) for i in range(len(vals))], "-", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("held-out CE (nats)")
    ax.set_title(study.study_name)
    ax.legend()
    fig.tight_layout()
    save(fig, "history.png")
    if len(finished) < 4:
        say(f"reslm: no importance plot yet ({len(finished)} finished trials; it needs 4)", enabled=progress)
        return
    try:
        imp = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError, ZeroDivisionError) as e:
        say(f"reslm: no importance plot yet ({e})", enabled=progress)
        return
    if not imp:
        return
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(imp) + 1.2))
    names = list(imp)[::-1]
    ax.barh(names, [imp[n] for n in names])
    ax.set_xlabel("importance (PED-ANOVA)")
    fig.tight_layout()
    save(fig, "importance.png")
