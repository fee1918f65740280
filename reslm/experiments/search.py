"""Hyperparameter search (`reslm search`): optuna's TPE over a reservoir substrate's knobs.

    objective     CE in nats on the held-out tails of the training shards (TrainConfig.holdout): the
                  ridge readout's held-out CE (default: one pass and a few Cholesky solves per trial),
                  or with `--optimizer adam` the CE after the Adam budget on the rest, trained by
                  `reslm.train.train` itself (a run with heldout_eval in a temporary folder). The test
                  shard is never read.
    space         SPACE below: the reservoir fields of the character families that the substrate's
                  config has (spectral_radius, input_scaling, leak_rate, bias_scaling, density) and
                  its own knobs, passed through reservoir_options (leaky a_min/a_max, deep layers,
                  nvar k, diagonal r_min, delay eta/node_coupling/p, gru gate_scaling/update_bias). A knob given as a flag is fixed
                  and left out of the search.
    study         optuna, TPESampler seeded by child_seed(seed, worker, trials already in the study),
                  storage SQLite (default OUT/study.db): re-running continues the study, and several
                  processes (each its own --worker index) can fill one study together. A worker
                  killed mid-trial (kill -9, a lost machine) leaves its finished trials in the
                  database; its trial in progress stops sending heartbeats (every HEARTBEAT_S) and is
                  marked failed, once they have been silent GRACE_S, by the next worker that starts a
                  trial, which retries its parameters once (optuna's RetryHeartbeatStaleTrialCallback).

Outputs in OUT (rewritten atomically after every run of the command, from all trials in the study, by
reslm.report.search.write_outputs; OUT must be new, empty or a search folder: search.json, written
first, marks one):
    trials.csv          number, state, value, seconds, each parameter, error
    best.json           the best trial: value, parameters, model and training overrides, command
    best_command.txt    the best config as a ready `reslm train ...` command (also printed)
    history.png         objective per trial and best so far (matplotlib; skipped with a note if missing)
    importance.png      parameter importances (optuna's PED-ANOVA evaluator, no scikit-learn; from 4 finished trials)
"""
from __future__ import annotations

import contextlib
import fcntl
import inspect
import json
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

from reslm.core import claims
from reslm.core.device import pick_device, use_threads
from reslm.core.errors import ReslmError
from reslm.core.files import open_plain, plain_stat, read_json, write_json
from reslm.core.metrics import HELDOUT_LOSS, final_of
from reslm.run import LOCK
from reslm.models import build_model, make_config, preset
from reslm.models import family as family_of
from reslm.core.progress import say
from reslm.reservoir import RESERVOIRS, parse_options
from reslm.reservoir.nvar import nvar_size
from reslm.report.search import train_command, write_outputs
from reslm.reservoir.seeding import child_seed
from reslm.train import TrainConfig, create_run, make_run_config, train
from reslm.data.splits import check_tails
from reslm.train.batches import CharShards
from reslm.train.ridge import fit_ridge

SEARCH_STAMP = "search.json"   # written first into a search folder: what check_search_folder looks for
SEARCH_KEY = 200   # seeding key of the samplers (apart from the reservoir's and training's keys)
FAMILIES = ("rc", "aerc")
HEARTBEAT_S, GRACE_S = 10, 60   # a running trial's heartbeat period; silent this long, it is stale (killed)

# (low, high, log); int knobs have int bounds. Model fields apply where the substrate's config has them.
MODEL_KNOBS = {"spectral_radius": (0.1, 1.5, False), "input_scaling": (0.05, 8.0, True),
               "leak_rate": (0.05, 1.0, True), "bias_scaling": (0.0, 2.0, False), "density": (0.01, 1.0, True)}
SPACE = {  # substrate: (its own knobs, through reservoir_options; model knobs it leaves out or bounds differently)
    "esn": ({}, {}),
    "leaky": ({"a_min": (0.002, 0.5, True), "a_max": (0.05, 1.0, True)}, {"leak_rate": None}),
    "deep": ({"layers": (1, 4, False), "inter_scaling": (0.1, 4.0, True)}, {}),
    "parallel": ({}, {"leak_rate": None}),   # its leaks are a list (reservoir option), not one searched knob
    "nvar": ({"k": (1, 3, False)}, {}),
    "diagonal": ({"r_min": (0.0, 0.99, False)}, {"spectral_radius": (0.5, 1.0, False)}),
    "delay": ({"eta": (0.05, 1.5, False), "node_coupling": (0.05, 1.0, False), "p": (0.5, 4.0, True)}, {}),
    "gru": ({"gate_scaling": (0.1, 4.0, True), "update_bias": (-3.0, 3.0, False)}, {}),
    "poly": ({}, {}),   # products stays a given option (default half the size): its range depends on --size
    "es2n": ({"beta": (0.005, 1.0, True)}, {"leak_rate": None}),   # beta mixes; the leak stays 1
    "legendre": ({"theta": (2.0, 1024.0, True)}, {}),   # order follows from --size (size = embed_dim x order)
    "composite": ({}, {"leak_rate": None}),   # the knobs go to every part that has them; parts is a given option
}


def search_space(reservoir: str, fixed_model: dict, fixed_options: dict) -> tuple[dict, dict]:
    """({model field: bounds}, {option: bounds}) searched for `reservoir`, without the fixed ones."""
    if reservoir not in SPACE:
        raise ReslmError(f"no search space for reservoir {reservoir!r} (known: {', '.join(SPACE)})")
    options, model_changes = SPACE[reservoir]
    cfg_cls = RESERVOIRS[reservoir][0]
    names = {f.name for f in fields(cfg_cls)}
    model = {k: model_changes.get(k, b) for k, b in MODEL_KNOBS.items() if k in names}
    model = {k: b for k, b in model.items() if b is not None and k not in fixed_model}
    return model, {k: b for k, b in options.items() if k not in fixed_options}


def _suggest(trial, name: str, bounds: tuple):
    low, high, log = bounds
    if isinstance(low, int) and isinstance(high, int):
        return trial.suggest_int(name, low, high, log=log)
    return trial.suggest_float(name, float(low), float(high), log=log)


def _repair(reservoir: str, model: dict, options: dict) -> None:
    """Make a point valid where knobs constrain each other (in place): model and options hold the
    whole configuration (fixed and sampled)."""
    if reservoir == "leaky" and options.get("a_min", 0.01) > options.get("a_max", 1.0):
        options["a_min"], options["a_max"] = options["a_max"], options["a_min"]
    if reservoir == "diagonal" and "r_min" in options:
        options["r_min"] = min(options["r_min"], model.get("spectral_radius", 0.99))
    if reservoir == "nvar":  # the feature count follows from k (any --size is replaced)
        model["size"] = nvar_size(options.get("k", 2), model.get("embed_dim", 16))


def _options_text(options: dict) -> str:
    """key=value,... as parse_options reads it: strings bare (input_init=normal), numbers exactly."""
    return ",".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in options.items())


def heldout_loss(family: str, model_over: dict, train_over: dict, dataset, optimizer: str = "ridge") -> dict:
    """Build one configuration and return its objective: held-out CE (nats) and the seconds it took.

    ridge: train.py's ridge solve (fit_ridge, as `reslm train --optimizer ridge` runs it) on a source
    that holds the tails out; its held-out CE is the objective. adam: a run of `reslm.train.train` in a
    temporary folder with heldout_eval on (it trains on the rest of each training shard and evaluates on
    the tails, never on the test shard); its last evaluation is the objective."""
    cfg = make_run_config(family, model_over, {**train_over, "optimizer": optimizer}, dataset)
    tc = TrainConfig(**cfg["train"]).validate()
    check_tails(dataset, tc.holdout, cfg["model"]["context"], tc.shard_chars)
    t0 = time.perf_counter()
    if optimizer == "ridge":
        device = pick_device(tc.device)
        model = build_model(family, make_config(family, **cfg["model"])).to(device)
        try:
            source = CharShards(model, dataset, tc, device, None, False, holdout=tc.holdout)
            t0 = time.perf_counter()
            info = fit_ridge(model, source, tc)
        finally:
            claims.release()   # the memory its states claimed (reslm.core.device.state_dtypes)
        value = info[HELDOUT_LOSS]
        extra = dict(ridge_alpha=info["ridge_alpha"], temperature=info["temperature"])
    else:
        with tempfile.TemporaryDirectory(prefix="reslm-trial-") as tmp:
            run = create_run(Path(tmp) / "run", family, model_over,
                             {**train_over, "optimizer": optimizer, "heldout_eval": True}, dataset)
            value, extra = train(run, progress=False)[final_of(HELDOUT_LOSS)], {}
    if not math.isfinite(value):
        raise ReslmError("the held-out loss is not finite")
    return dict(value=value, seconds=time.perf_counter() - t0, **extra)


def check_search_folder(out: Path) -> None:
    """ReslmError unless `out` is missing, empty (a .lock aside) or a search folder: it holds
    search.json (what run_search writes first) or, from before search.json, an SQLite study.db. `reslm
    search` rewrites trials.csv, best.json and the plots there, so a folder of anything else is refused,
    as train, reproduce and lab refuse theirs."""
    out = Path(out)
    if not os.path.lexists(out):
        return
    if out.is_symlink() or not out.is_dir():
        raise ReslmError(f"{out} exists and is not a directory; pick another --out")
    try:
        entries = [p for p in out.iterdir() if p.name != LOCK]
    except OSError as e:
        raise ReslmError(f"cannot use {out}: {e.strerror or e}") from None
    if not entries:
        return
    stamp, db = out / SEARCH_STAMP, out / "study.db"
    if plain_stat(stamp) is not None and isinstance(read_json(stamp), dict):
        return
    if plain_stat(db) is not None:
        fd = open_plain(db)
        try:
            if os.read(fd, 16) == b"SQLite format 3\x00":
                return
        finally:
            os.close(fd)
    raise ReslmError(f"{out} already exists and is not a search folder (no {SEARCH_STAMP}); pick another --out")


def _import_optuna():
    try:
        import optuna
    except ImportError:
        raise ReslmError("reslm search needs optuna: pip install 'reslm[lab]'") from None
    return optuna


def _heartbeat_storage(optuna, url: str):
    """RDBStorage at `url` with heartbeats and one retry of a stale (killed) trial's parameters; the
    callback's names changed in optuna 5 (RetryHeartbeatStaleTrialCallback), the old ones still work."""
    stores = optuna.storages
    retry = getattr(stores, "RetryHeartbeatStaleTrialCallback", None) or stores.RetryFailedTrialCallback
    arg = ("heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback"
           in inspect.signature(stores.RDBStorage).parameters else "failed_trial_callback")
    with warnings.catch_warnings():   # heartbeats are "experimental" in optuna; they are what kill -9 needs
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # SQLite: several workers wait for the write lock up to 60 s, not 5
        engine = dict(connect_args={"timeout": 60}) if url.startswith("sqlite") else None
        return stores.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, engine_kwargs=engine,
                                 **{arg: retry(max_retry=1)})


@contextlib.contextmanager
def _turns(path: Path):
    """Hold an exclusive flock on `path` (made if missing, never through a link): processes take turns."""
    fd = open_plain(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)   # released when fd closes
        yield
    finally:
        os.close(fd)


def _claim(out: Path, stamp: dict) -> bool:
    """Make `out` a search folder (search.json), or check that it is one (check_search_folder: a folder of
    the user's is refused, left as it was). Workers started together on a new folder take turns on its
    .lock, so that none sees another's half-made folder. True when this call made the folder."""
    if os.path.lexists(out) and (out.is_symlink() or not out.is_dir()):
        check_search_folder(out)   # raises: not a directory
    made = not os.path.lexists(out)
    out.mkdir(parents=True, exist_ok=True)
    had_lock = os.path.lexists(out / LOCK)
    try:
        with _turns(out / LOCK):
            check_search_folder(out)   # never write trials.csv, best.json, ... over a folder of the user's
            if not os.path.lexists(out / SEARCH_STAMP):
                write_json(out / SEARCH_STAMP, stamp)
    except ReslmError:
        if not had_lock:
            (out / LOCK).unlink(missing_ok=True)
        raise
    return made


def _open_study(optuna, url: str, name: str):
    """Create or load the study. Workers started together on a new SQLite file would race to create its
    tables ("table ... already exists", "UNIQUE constraint failed"): they take turns on a flock beside it."""
    heartbeat = "://" in url and not url.startswith(("redis", "journal"))   # an RDB URL (module doc)
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    with contextlib.ExitStack() as stack:
        try:
            if path and path != ":memory:":
                stack.enter_context(_turns(Path(f"{path}.lock")))
            storage = _heartbeat_storage(optuna, url) if heartbeat else url
            return optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)
        except Exception as e:  # a bad storage URL, an unreadable database, a study of another direction
            raise ReslmError(f"cannot open study {name!r} in {url}: {e}") from None


SEARCH_DATA = "shakespeare"   # the character dataset a search reads unless told


def search_folder(family: str, reservoir: str) -> Path:
    """The folder a search writes to when none is given: runs/search-FAMILY-RESERVOIR."""
    return Path(f"runs/search-{family}-{reservoir}")


def search_model(family: str, preset_name: str | None, model_over: dict) -> tuple[str, dict]:
    """The fixed model fields of a search: the size of `preset_name` (a preset of `family`) under the ones
    given; returns (the reservoir searched, default esn; the other fixed model fields)."""
    if preset_name:
        name, over = preset(preset_name)
        if name != family:
            raise ReslmError(f"preset {preset_name} is family {name}, not {family} (add --family {name})")
        model_over = {**over, **model_over}
    model_over = dict(model_over)
    return model_over.pop("reservoir", "esn"), model_over


def run_search(out: Path, dataset, *, family: str = "rc", reservoir: str = "esn", model_over: dict | None = None,
               train_over: dict | None = None, trials: int = 20, optimizer: str = "ridge", storage: str | None = None,
               study_name: str | None = None, seed: int = 0, worker: int = 0, progress: bool = True) -> dict:
    """Add `trials` trials to the study (created or continued) and write the outputs (module doc).
    Returns best.json's content."""
    optuna = _import_optuna()
    _check_request(family, reservoir, optimizer, trials, seed, worker)
    search = _Search.of(family, reservoir, optimizer, model_over or {}, train_over or {})
    search.check_fixed(dataset)
    out = Path(out)
    study = _study_in(optuna, out, storage, study_name or f"{family}-{reservoir}-{optimizer}",
                      dict(family=family, reservoir=reservoir, optimizer=optimizer))
    # seeded by the worker and the trials already there, so resumed and parallel runs draw apart
    study.sampler = optuna.samplers.TPESampler(seed=child_seed(seed, SEARCH_KEY, worker, len(study.trials)) % 2**32)
    study.set_user_attr("setup", dict(family=family, reservoir=reservoir, optimizer=optimizer))
    study.optimize(lambda trial: search.objective(trial, dataset, progress), n_trials=trials, catch=(ReslmError,))
    return write_outputs(out, study, family, optimizer, search.train_over, dataset, progress)


def _check_request(family: str, reservoir: str, optimizer: str, trials: int, seed: int, worker: int) -> None:
    """run_search's arguments checked before anything is built: a reservoir family, an objective it has
    (ridge: rc only), counts in range, a registered substrate with knobs to search."""
    if family not in FAMILIES:
        raise ReslmError(f"reslm search tunes the reservoir families ({', '.join(FAMILIES)}), not {family!r}")
    if optimizer not in ("ridge", "adam"):
        raise ReslmError(f"optimizer must be ridge or adam, got {optimizer!r}")
    if optimizer == "ridge" and family != "rc":
        raise ReslmError("the ridge objective is the rc family's; use --optimizer adam for aerc")
    if trials < 1 or seed < 0 or worker < 0:
        raise ReslmError("--trials must be >= 1, --seed and --worker >= 0")
    if reservoir not in RESERVOIRS:
        raise ReslmError(f"unknown reservoir {reservoir!r} (known: {', '.join(RESERVOIRS)})")
    if reservoir not in SPACE:
        raise ReslmError(f"the {reservoir} substrate has no knobs to search (a recording's states are fixed): "
                         f"search one of {', '.join(SPACE)}")


@dataclass
class _Search:
    """What a search fixes (the model fields and substrate options given as flags, the training
    overrides) and what it samples (search_space: model fields and substrate options with their bounds)."""
    family: str
    reservoir: str
    optimizer: str
    model_over: dict         # the fixed model fields, the reservoir among them
    train_over: dict
    fixed_options: dict      # the substrate's options given (--reservoir-options)
    space_model: dict
    space_options: dict

    @classmethod
    def of(cls, family: str, reservoir: str, optimizer: str, model_over: dict, train_over: dict) -> "_Search":
        """The search of `reservoir` under the fixed model fields and substrate options given."""
        model_over = {**model_over, "reservoir": reservoir}
        fixed_options = parse_options(reservoir, RESERVOIRS[reservoir][0], model_over.get("reservoir_options", ""),
                                      reserved={f.name for f in fields(family_of(family).config)} | {"input_dim"})
        space_model, space_options = search_space(reservoir, model_over, fixed_options)
        return cls(family, reservoir, optimizer, model_over, dict(train_over), fixed_options, space_model,
                   space_options)

    def configure(self, model: dict, options: dict) -> dict:
        """The model overrides of one point: fixed flags, then the sampled knobs, repaired."""
        model, options = {**self.model_over, **model}, {**self.fixed_options, **options}
        _repair(self.reservoir, model, options)
        return {**model, "reservoir_options": _options_text(options)} if options else model

    def check_fixed(self, dataset) -> None:
        """The fixed part must be valid before any trial runs (one clear error, not N failed trials): its
        run config, the held-out tails, the device; the training's threads are set."""
        base = make_run_config(self.family, self.configure({}, {}), {**self.train_over, "optimizer": self.optimizer},
                               dataset)
        tc = TrainConfig(**base["train"]).validate()
        check_tails(dataset, tc.holdout, base["model"]["context"], tc.shard_chars)
        pick_device(tc.device)   # a bad --device is one error now, not one failed trial each
        if tc.threads:
            use_threads(tc.threads)

    def objective(self, trial, dataset, progress: bool) -> float:
        """One trial: a point sampled, its configuration built and scored (heldout_loss); its model
        overrides, seconds, ridge choices or error kept as the trial's attributes, and a line printed."""
        model = {k: _suggest(trial, k, b) for k, b in self.space_model.items()}
        options = {k: _suggest(trial, k, b) for k, b in self.space_options.items()}
        m_over = self.configure(model, options)
        trial.set_user_attr("model", m_over)
        try:
            result = heldout_loss(self.family, m_over, self.train_over, dataset, self.optimizer)
        except ReslmError as e:
            trial.set_user_attr("error", str(e))
            raise
        trial.set_user_attr("seconds", round(result["seconds"], 3))
        for k in ("ridge_alpha", "temperature"):
            if k in result:
                trial.set_user_attr(k, result[k])
        shown = {**{k: m_over[k] for k in self.space_model},
                 **({"options": m_over["reservoir_options"]} if options else {})}
        say(f"trial {trial.number}: held-out CE {result['value']:.4f} nats in {result['seconds']:.1f} s  "
            + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()),
            enabled=progress)
        return result["value"]


def _study_in(optuna, out: Path, storage: str | None, study_name: str, stamp: dict):
    """The study the search adds to: `out` claimed as a search folder (search.json: `stamp`), the study
    created or loaded from `storage` (default OUT/study.db). A study that cannot be opened leaves no
    folder behind that this call made (a bad --storage)."""
    made = _claim(out, stamp)
    url = storage or f"sqlite:///{(out / 'study.db').resolve()}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return _open_study(optuna, url, study_name)
    except ReslmError:
        if made and {p.name for p in out.iterdir()} <= {LOCK, SEARCH_STAMP}:   # no output folder left behind
            for name in (SEARCH_STAMP, LOCK):                                  # a bad --storage
                (out / name).unlink(missing_ok=True)
            out.rmdir()
        raise


__all__ = ["SPACE", "MODEL_KNOBS", "SEARCH_DATA", "search_folder", "search_model", "search_space", "heldout_loss",
           "run_search", "write_outputs", "train_command"]
