"""`reslm frontier bench`: how good a language model is *your* reservoir at the paper's budget?

The frontier's recipe (the configuration the RECIPE_PLAN's rule chose on validation, from results/) is run
with your reservoir in place of the ESN, at each seed, after the strict rules are checked (a fixed
substrate, a head that reads only its state, at most the budget's trainable parameters: a --size other
than the recipe's gets the widest head that fits). Its test CE is printed beside the published ESN
frontier and the tuned trained ceiling, all read the same way: the test text scored with the state
carried through it. A model card (card.md) records what ran, where, and every figure.

Budgets: "full" is the recipe as published; "quick" trains one shard-epoch per shard over one cycle (a
tenth of the full recipe's steps) with the learning rate, schedule and EMA of QUICK_PLAN, the candidate quick
recipe (reslm.frontier.ranks.RECIPE_PLANS) chosen by how well it ranks substrates against full on half of
them (docs/frontier-plans.md, docs/frontier-tool.md "Which quick recipe"); the esn-quick plan is the ESN
trained so, the reference printed beside a quick bench.
"""
from __future__ import annotations

import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import MISSING
from dataclasses import fields as dataclass_fields
from pathlib import Path

import reslm
from reslm.core import stop
from reslm.core.device import WORKING_BYTES, amount, check_memory, cpu_name, usable_cores, use_threads
from reslm.core.errors import OutOfMemory, ReslmError, Stopped
from reslm.core.files import atomic_write, read_json, write_json
from reslm.core.shell import path_word
from reslm.core.metrics import LN2, TEST_LOSS, VAL_LOSS, final_of, kept_of
from reslm.data.datasets import find_dataset
from reslm.data.splits import ShardSplit
from reslm.frontier.imports import _import, source_name
from reslm.frontier.plan import Config, load_plan
from reslm.frontier.profile import PLOT, bench_memory, memory_lines, plot_bench_memory
from reslm.frontier.ranks import QUICK_PLAN, quick_fields
from reslm.frontier.runner import plan_table, selection
from reslm.frontier.schedule import MEMORY
from reslm.models import family
from reslm.models.identity import command, delta, describe, run_name
from reslm.models.load import check_fits
from reslm.models.resolve import ModelSpec, resolve
from reslm.reservoir import KNOBS, RESERVOIRS, parse_options
from reslm.run import CHECKPOINT, SUMMARY, is_finished
from reslm.scoring.memory import LENGTHS, POSITIONS, profile_bytes
from reslm.settings import TrainConfig
from reslm.train.batches import pass_bytes, pass_fix, state_rows
from reslm.train import ensure_run, train

RECIPE_PLAN = "esn-lr"          # the plan whose chosen configuration is the recipe
CEILING_PLANS = ("gru-ceiling", "ceilings-tails")   # the trained ceilings: the first with a choice wins
BUDGETS = ("quick", "full")
QUICK = quick_fields()
QUICK_TEXT = "one shard-epoch per shard, one cycle (a tenth of the steps: minutes per seed on 2 cores)" + "".join(
    f", {k} {v}" for k, v in QUICK.items() if k not in ("epochs_per_shard", "cycles", "test_every"))
CARD = "card.md"
OUT = Path("runs/frontier-bench")   # where the bench's runs and card go unless told


def recipe_config(plan_name: str = RECIPE_PLAN, results: Path = Path("results")) -> Config:
    """The chosen configuration of the recipe plan (its base while the rule has chosen nothing)."""
    plan = load_plan(plan_name)
    chosen = selection(plan, plan_table(plan, results, Path("runs")))["chosen"]
    return next((c for c in plan.configs if (c.label or "base") == chosen), plan.base)


def _fit_head(spec: ModelSpec, budget: int) -> ModelSpec:
    """The same configuration with the widest head_hidden whose trainable count fits `budget` (a linear head
    has no width: unchanged, its count is checked with the strict rules)."""
    if spec.config.head == "linear":
        return spec
    def count(h):
        return spec.replace(head_hidden=h).frontier.trainable_params
    lo, hi = 1, 4096
    if count(lo) > budget:
        raise ReslmError(f"reservoir size {spec.config.size} leaves no room for a head within {budget:,} "
                         "trainable parameters")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(mid) <= budget else (lo, mid - 1)
    return spec.replace(head_hidden=lo)


# model fields a `--set` may not give: each has its own flag (or is the dataset's)
_OWN_FLAGS = {"reservoir": "--reservoir", "reservoir_options": "--reservoir-options", "size": "--size",
              "seed": "--seeds", "vocab_size": "the dataset"}


def parse_set(family_name: str, text: str | None) -> dict:
    """{field: value} from `--set k=v,k=v`: fields of the family's model config, each value converted to its
    field's type. One line naming the field for an unknown one, a bad value, a field with its own flag, or one
    given twice (which of the two is meant is not guessed)."""
    fields_ = {f.name: f for f in dataclass_fields(family(family_name).config)}
    out, given = {}, {}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        key, eq, value = (t.strip() for t in item.partition("="))
        if not eq or not key:
            raise ReslmError(f"--set {item!r} is not field=value (e.g. --set spectral_radius=0.99)")
        if key in given:
            raise ReslmError(f"--set {key} is given twice ({key}={given[key]} and {key}={value}): give it once")
        given[key] = value
        if key in _OWN_FLAGS:
            raise ReslmError(f"--set {key}: give it with {_OWN_FLAGS[key]}")
        if key not in fields_:
            raise ReslmError(f"--set {key}: the {family_name} model has no such field; its fields: "
                             f"{', '.join(k for k in fields_ if k not in _OWN_FLAGS)}")
        kind = type(fields_[key].default)
        try:
            out[key] = _value(kind, value)
        except ValueError:
            raise ReslmError(f"--set {key}={value!r} is not a valid {kind.__name__}") from None
    return out


def _value(kind: type, text: str):
    """`text` as a value of type `kind` (a bool from true/false, yes/no, on/off, 1/0); ValueError otherwise."""
    if kind is bool:
        if text.lower() not in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            raise ValueError(text)
        return text.lower() in ("true", "yes", "on", "1")
    return kind(text)


def _own_defaults(reservoir: str, base: Config) -> tuple[dict, dict]:
    """The recipe's model fields with its reservoir values (the knobs it tuned for its own substrate: spectral
    radius, input scaling, ..., and its reservoir options: the input initialisation) replaced by `reservoir`'s
    own defaults, those of its registered config class (a field it does not have is left at the family's
    default); and {field: the recipe's value} of what was not applied."""
    own = {f.name: f.default for f in dataclass_fields(RESERVOIRS[reservoir][0]) if f.default is not MISSING}
    tuned = {k: v for k, v in base.model.items() if k in KNOBS and k not in ("size", "seed")}
    model = {k: v for k, v in base.model.items() if k not in tuned and k != "reservoir_options"}
    model.update({k: own[k] for k in tuned if k in own})
    if base.model.get("reservoir_options"):
        tuned["reservoir_options"] = base.model["reservoir_options"]
    return model, tuned


def _with_flags(reservoir: str, e: ReslmError) -> ReslmError:
    """A substrate's refusal in the bench's words: the flag that fixes it named."""
    text = re.sub(r"set size to (\d+), not \d+", r"give --size \1", str(e))
    text = text.replace("(a model field: set it with its own flag)", "(a model field: give it with --set KEY=VALUE)")
    hint = "" if "--" in text else (" (the reservoir's size: --size; other model fields: --set KEY=VALUE; the "
                                    "substrate's own options: --reservoir-options)")
    return ReslmError(f"{reservoir} in the recipe: {text}{hint}")


def _shown(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def used_values(spec: ModelSpec, names=None) -> dict:
    """{knob: value} the configuration's substrate runs at, for the knobs `names` (default: every reservoir
    knob and input_init) that its config has."""
    res = spec.config.reservoir_config()
    names = names or [k for k in (*KNOBS, "input_init") if k not in ("size", "seed")]
    return {k: getattr(res, k) for k in names if hasattr(res, k)}


def bench_config(reservoir: str, base: Config, *, budget: str = "quick", reservoir_options: str | None = None,
                 size: int | None = None, limit: int = 155_459, label: str | None = None,
                 settings: dict | None = None) -> tuple[Config, list[str], ModelSpec]:
    """The recipe with `reservoir` (its registry name: source_name for one from a file) in place of its own,
    checked against the strict rules and memory; notes on what was adapted; and its model configuration
    (ModelSpec, resolved once). The recipe's reservoir values were tuned for its own substrate (the ESN)
    and go with it only: any other substrate starts from its own registered defaults (`_own_defaults`), then
    `settings` (`--set`: model fields) and `reservoir_options` over them. A substrate's refusal names the flag
    that fixes it. The configuration's label (default "RESERVOIR-BUDGET") goes into its runs' folder names."""
    if reservoir not in RESERVOIRS:
        raise ReslmError(f"unknown reservoir {reservoir!r} (registered: {', '.join(RESERVOIRS)}; --import FILE.py "
                         "registers your own)")
    notes = []
    if reservoir == base.model.get("reservoir", "esn"):
        model = dict(base.model)
    else:
        model, tuned = _own_defaults(reservoir, base)
        if tuned:
            notes.append(f"the recipe's values tuned for {base.model.get('reservoir', 'esn')} "
                         f"({', '.join(f'{k}={v}' for k, v in tuned.items())}) are not applied to {reservoir}: it "
                         "starts from its own defaults")
    model = {**model, **(settings or {}), "reservoir": reservoir}
    if reservoir_options is not None:
        model["reservoir_options"] = reservoir_options
    cfg_cls = RESERVOIRS[reservoir][0]
    unused = [k for k in settings or {} if k in KNOBS and k not in cfg_cls.__dataclass_fields__]
    if unused:   # a knob the substrate does not have would change the run's name and not its states
        has = [k for k in KNOBS if k in cfg_cls.__dataclass_fields__ and k not in _OWN_FLAGS]
        raise ReslmError(f"--set {unused[0]}: the {reservoir} reservoir does not use it (its knobs: "
                         f"{', '.join(has) or 'none'}; its own options go in --reservoir-options)")
    try:   # fields a substrate fixes itself (a recording's size): its own, not the recipe's
        implied = cfg_cls.implied(parse_options(reservoir, cfg_cls, model.get("reservoir_options", ""),
                                                reserved={*family(base.family).config.__dataclass_fields__,
                                                          "input_dim"}))
    except ReslmError as e:
        raise _with_flags(reservoir, e) from None
    model = {k: v for k, v in model.items() if k not in implied or k in (settings or {})}
    train = {**base.train, **(QUICK if budget == "quick" else {})}
    cfg = Config(label=label or f"{reservoir}-{budget}", family=base.family, preset=base.preset, data=base.data,
                 model=model, train=train)
    try:
        if size is not None and size != resolve(base.family, base.model).config.size:
            spec = _fit_head(resolve(cfg.family, {**model, "size": size}), limit)
            model = {**model, "size": size, **({"head_hidden": spec.config.head_hidden}
                                               if spec.config.head != "linear" else {})}
            cfg = Config(**{**cfg.__dict__, "model": model})
            if "head_hidden" in model:
                notes.append(f"size {size}: the head's width fitted to the budget ({model['head_hidden']})")
        else:
            spec = resolve(cfg.family, model)
        verdict = spec.frontier
    except ReslmError as e:
        raise _with_flags(reservoir, e) from None
    if not verdict.ok:
        raise ReslmError(f"{reservoir} in the recipe breaks the strict rules: {'; '.join(verdict.reasons)}")
    check_fits(spec)   # before any folder is made or model built
    return cfg, notes, spec


def run_bytes(cfg: Config, spec: ModelSpec, dataset) -> dict[str, int]:
    """{part: bytes} one of the bench's runs holds at once, each counted at least (the narrowest dtype its
    state_dtype allows): "weights" (spec.bytes), "states" (a training shard's, the test states and the
    held-out ones, as reslm.train.batches counts them for reslm.core.device.state_dtypes), "pass" (the
    reservoir's working buffers over the longest text it reads in one pass: reslm.core.device.
    reservoir_pass_bytes, which the streams, the warm-up and the context scale) and "process" (WORKING_BYTES);
    a model without a reservoir (no streams) only its weights and the process's own."""
    parts = {"weights": spec.bytes, "process": WORKING_BYTES}
    c = spec.config
    if not hasattr(c, "streams"):
        return parts
    tc = TrainConfig.of_run(cfg.run_config(0))
    longest, n_test, heldout, text = state_rows(dataset, ShardSplit.of_run(dataset, c.context, tc, tc.heldout), tc,
                                                c.context)
    item = 4 if tc.state_dtype in ("float32", "fp32") else 2
    parts["states"] = (longest + n_test + heldout) * spec.shape.width * item
    parts["pass"] = pass_bytes(c, getattr(spec.shape, "reservoir", None), text, item)   # a recording: none
    return parts


_SHRINK = {"weights": "--size", "states": "--size (or --set readout_dim)"}
_WHAT = {"weights": "weights", "process": "the process's own", "states": "states",
         "pass": "the reservoir's pass over a shard"}


def check_run_memory(cfg: Config, spec: ModelSpec, dataset, memory_positions: int = 0) -> None:
    """Before any folder is made: what one of the bench's runs holds at once (run_bytes: every field that
    scales it, the streams included), and the memory profile's windows after it (reslm.scoring.memory.
    profile_bytes, `memory_positions`), each against this machine by reslm.core.device.check_memory's rule:
    exit 2 with one line naming the flag that shrinks its largest part when it can never fit, 75 when not now."""
    parts = run_bytes(cfg, spec, dataset)
    c = spec.config
    big = max((k for k in parts if k != "process"), key=parts.get)   # the part a flag shrinks
    fix = pass_fix(c, "--set ") if big == "pass" else f"give a smaller {_SHRINK[big]}"
    shown = ", ".join(f"{_WHAT[k]} {amount(v)}" for k, v in parts.items())
    check_memory(sum(parts.values()), f"each of the bench's runs ({shown})", fix)
    if memory_positions:   # at most the test shard's positions (reslm.scoring.memory.memory_positions)
        a, b = dataset.shards[dataset.test_shard]
        n = max(1, min(memory_positions, b - a - max(LENGTHS)))
        check_memory(profile_bytes(n, max(LENGTHS)), f"the memory profile at --memory-positions "
                     f"{memory_positions:,}", "give a smaller --memory-positions")


def _group(label: str, plan_name: str, results: Path, budget: str = "full") -> dict | None:
    """A published reference: the chosen configuration of a plan (or its base, complete), its mean ± sd."""
    try:
        plan = load_plan(plan_name)
    except ReslmError:
        return None
    table = plan_table(plan, results, None)
    sel = selection(plan, table)
    base = plan.base.label or "base"
    key = sel["chosen"] or (base if sel["groups"][base]["complete"] else None)
    if key is None:
        return None
    g = sel["groups"][key]
    done = next(e for e in table if e.label == key and e.state == "done")
    trainable = (read_json(done.folder / SUMMARY) or {}).get("trainable_params")
    return dict(name=f"{label}: {plan_name} plan, {key}", test=g["test_stream"] or g["test"], seconds=g["train_seconds"],
                budget=budget, trainable=trainable, label=label, folder=done.folder.name)


def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)


def _row(name, st, seconds, trainable, budget, curve=None) -> str:
    reads = "-" if not curve or curve.get("16") is None else f"{curve['16']:.3f} / {curve['256']:.3f}"
    if not st:
        return f"| {name} | {budget} | {trainable or '-'} | not measured | - | - | {reads} |"
    mean, sd, n = st
    wall = f"{seconds[0] / 60:.1f} min" if seconds else "-"
    return (f"| {name} | {budget} | {f'{trainable:,}' if trainable else '-'} | {mean:.4f} ± {sd:.4f} ({n}) | "
            f"{mean / LN2:.3f} | {wall} | {reads} |")


def bench(reservoir: str, *, budget: str = "quick", seeds=(0, 1, 2), imports=None, reservoir_options=None,
          size=None, out: Path = OUT, results: Path = Path("results"), jobs: int | None = None,
          threads: int | None = None, data_root: Path | None = None, progress: bool = True,
          recipe_plan: str = RECIPE_PLAN, settings: str | None = None,
          memory_positions: int = POSITIONS) -> dict:
    """Run the recipe with `reservoir` at each seed in out/, then the table and the model card. `settings`:
    model fields as `--set` gives them ("spectral_radius=0.99,input_scaling=0.5"), recorded in the runs'
    config, and so in their fingerprint and folder name. `memory_positions`: the test positions of the first
    seed's memory profile (reslm.frontier.profile: out/memory.json and memory.png, in the table and the card);
    0 leaves it out. `jobs`: seeds trained at once, each in its own process (None: one per core, each with its
    share of the threads)."""
    if budget not in BUDGETS:
        raise ReslmError(f"budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
    sources = _import(imports)
    # a reservoir from a file runs under its own name and the file's sha256 (source_name), never a built-in's
    source = next((s for s in sources if reservoir in s["names"]), None)
    base = recipe_config(recipe_plan, results)
    cfg, notes, spec = bench_config(source_name(reservoir, source["sha256"]) if source else reservoir, base,
                                    budget=budget, reservoir_options=reservoir_options, size=size,
                                    label=f"{reservoir}-{budget}", settings=parse_set(base.family, settings))
    # the operating point shown beside the figure: the knobs the recipe tuned, input_init and what --set gave
    shown = [k for k in base.model if k in KNOBS and k not in ("size", "seed")] + ["input_init"] + \
        list(parse_set(base.family, settings))
    used = ", ".join(f"{k}={_shown(v)}" for k, v in used_values(spec, list(dict.fromkeys(shown))).items())
    dataset = find_dataset(cfg.data, "chars", data_root, prepare=True)
    check_run_memory(cfg, spec, dataset, memory_positions)   # before any folder is made
    out = Path(out)
    runs = {s: out / run_name(cfg.run_config(s), cfg.label) for s in seeds}
    for s, run_dir in runs.items():   # every folder made (or checked) before the first one trains
        rc = cfg.run_config(s)
        ensure_run(run_dir, cfg.family, rc["model"], {**rc["train"], **({"threads": threads} if threads else {})},
                   dataset, preset=cfg.preset)
    t0 = time.perf_counter()
    try:
        with stop.graceful():   # a SIGTERM while a seed trains: it stops at the end of its step, none starts after
            jobs = _train_seeds(runs, jobs, threads, [src["path"] for src in sources], progress)
        if stop.requested() or not all(is_finished(d) for d in runs.values()):
            raise stopped(runs)   # no table row, profile or card of an unfinished run
        summaries = {s: read_json(d / SUMMARY) or {} for s, d in runs.items()}
        mine = dict(test=_stats([m.get(kept_of(TEST_LOSS), m.get(final_of(TEST_LOSS))) for m in summaries.values()]),
                    val=_stats([m.get(kept_of(VAL_LOSS), m.get(final_of(VAL_LOSS))) for m in summaries.values()]),
                    seconds=_stats([m.get("train_seconds") for m in summaries.values()]),
                    trainable=next(iter(summaries.values())).get("trainable_params"))
        refs = _references(recipe_plan, results, budget)
        about = ["this bench"] + ([f"{source['path']}, sha256 {source['sha256'][:12]}"] if source else []) + \
            ([used] if used else [])   # what the row's substrate is: its file, and the values it ran at
        mem = None
        if memory_positions:
            mem = bench_memory(runs, cfg, base, results, {r["label"]: r["folder"] for r in refs},
                               positions=memory_positions, progress=progress)
            write_json(out / "memory.json", mem)
            plot_bench_memory(mem, reservoir, out / PLOT)
        table = _table(f"**{reservoir}** ({'; '.join(about)})", mine, refs, budget, mem)
        flags = [*(["--size", str(size)] if size is not None else []),
                 *(["--reservoir-options", reservoir_options] if reservoir_options is not None else []),
                 *(["--set", settings] if settings else [])]
        wall = time.perf_counter() - t0
        card = _card(reservoir, cfg, base, notes + ([f"the substrate ran at {used}"] if used else []), sources, budget,
                     runs, summaries, table, threads, jobs, flags, memory_lines(mem, reservoir) if mem else [], wall)
        atomic_write(out / CARD, lambda p: p.write_text(card))
    except KeyboardInterrupt:   # Ctrl-C, a second SIGTERM, or one while no seed trains: at once
        raise stopped(runs, interrupted=True) from None
    return dict(table=table, card=str(out / CARD), runs={s: str(d) for s, d in runs.items()}, mine=mine,
                wall_seconds=wall, jobs=jobs)


def stopped(runs: dict, interrupted: bool = False) -> Stopped:
    """The one line of a bench that a stop ended before its card (reslm.core.stop): which seeds finished,
    which stopped part-way (at what step; their checkpoint kept) and which did not start; that no table,
    memory profile or card was written for an unfinished run; and the stop's exit status (stop.status; 2 where
    a seed ended unfinished without a stop asked of this call: a SIGTERM sent to its own process)."""
    done, part, none = [], [], []
    for s, d in runs.items():
        steps = (read_json(d / SUMMARY) or {}).get("steps")
        if is_finished(d):
            done.append(str(s))
        elif isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
            part.append(f"seed {s} stopped at step {steps:,}")
        elif (d / CHECKPOINT).exists():
            part.append(f"seed {s} stopped (its last checkpoint kept)")
        else:
            none.append(str(s))
    said = [f"{'seed' if len(done) == 1 else 'seeds'} {', '.join(done)} finished"] if done else []
    said += [", ".join(part)] if part else []
    said += [f"{'seed' if len(none) == 1 else 'seeds'} {', '.join(none)} not started"] if none else []
    why = "interrupted" if interrupted else "asked to stop (SIGTERM)" if stop.requested() else \
        "a seed's training ended before its end"
    status = stop.status(interrupted) if interrupted or stop.requested() else 2
    if part or none:
        return Stopped(f"frontier bench {why}: {'; '.join(said)}; no table, memory profile or card written (the "
                       "same command continues each unfinished seed from its checkpoint)", status)
    return Stopped(f"frontier bench {why}: every seed finished, the card was not written (the same command writes "
                   "it without training again)", status)


def _train_seeds(runs: dict, jobs: int | None, threads: int | None, imports: list[str], progress: bool,
                 poll: float = 2.0) -> int:
    """Train every seed's run that is not finished: `jobs` at once (None: as many as the machine has cores), each
    in its own process, or one by one here; the number of seeds that trained at once."""
    todo = [s for s, d in runs.items() if not is_finished(d)]
    jobs = max(1, min(jobs or usable_cores(), len(todo)))
    if jobs > 1:
        _parallel(todo, runs, jobs, threads, imports, poll)
    else:
        for s in todo:
            if stop.requested():   # asked to stop: no seed starts after it
                break
            train(runs[s], progress=progress)
    return jobs


def _references(recipe_plan: str, results: Path, budget: str) -> list[dict]:
    """The published groups the bench's row stands beside: the ESN frontier (and at quick the ESN's quick runs),
    and the first trained ceiling whose plan has chosen."""
    refs = [_group("ESN frontier", recipe_plan, results)]
    if budget == "quick":
        refs.append(_group("ESN, quick", "esn-quick", results, "quick"))
    refs += [next((g for g in (_group("trained ceiling", p, results) for p in CEILING_PLANS) if g), None)]
    return [r for r in refs if r]


def _table(first: str, mine: dict, refs: list[dict], budget: str, mem: dict | None) -> str:
    """The bench's table: its own row (`first`), then the references', each with its memory where measured."""
    curves = (mem or {}).get("references", {})
    lines = ["| model | budget | trainable | test CE, state carried (nats, mean ± sd (seeds)) | bits/char | "
             "train time per seed | CE from 16 / 256 chars |", "|---|---|---|---|---|---|---|",
             _row(first, mine["test"], mine["seconds"], mine["trainable"], budget, (mem or {}).get("curve"))]
    lines += [_row(r["name"], r["test"], r["seconds"], r["trainable"], r["budget"], curves.get(r["label"]))
              for r in refs]
    return "\n".join(lines)


WAIT_SHARE = 0.25   # a seed waits for the running ones when they should end within this share of a seed's time


def _parallel(todo: list[int], runs: dict, jobs: int, threads: int | None, imports: list[str],
              poll: float = 2.0, clock=time.monotonic) -> None:
    """Train the seeds' runs `jobs` at a time, each in its own process that first runs the --import files (so
    that it knows the user's reservoir) and then continues the run from its folder. Without `threads` each
    process gets its share of the cores, counted when it starts: the seeds left to start and those running, at
    most `jobs` of them. A seed that would start with fewer threads than it gets once the running ones end
    waits for them when they should end soon (the seeds are one configuration: each running one is expected
    to take as long as those that ended took, and it waits while their expected end is within WAIT_SHARE of
    that time, before or after), so that the last seed trains on every core rather than on one beside a run
    about to end. A seed whose process ran out of memory beside others (reslm.frontier.schedule.MEMORY) goes
    again alone, with every core, once they end; any other failure lets the others finish, starts nothing
    more, and is then raised. A stop asked of this call (reslm.core.stop: a SIGTERM) is passed on to the seeds
    running, which stop at the end of their step as their deadline would, and no seed starts after it; an
    interrupt (Ctrl-C, a second SIGTERM) passes the stop on, waits for them and is raised again (`_end`)."""
    cores = usable_cores()
    queue, procs, alone, tried, failed = list(todo), {}, [], set(), []
    started, took = {}, []   # when each running seed started; how long each ended one took
    passed_on = False        # a stop asked of this call, passed on to the seeds running
    try:
        while procs or ((queue or alone) and not failed and not stop.requested()):
            if stop.requested() and not passed_on:
                for p in procs.values():
                    p.send_signal(signal.SIGTERM)
                passed_on = True
            if alone and not procs and not failed and not stop.requested():
                s = alone.pop(0)
                tried.add(s)
                procs[s], started[s] = _spawn(runs[s], threads or cores, imports), clock()
            while queue and not alone and not failed and not stop.requested() and len(procs) < jobs:
                share = max(1, cores // min(jobs, len(queue) + len(procs)))
                if not threads and procs and took and share < cores // min(jobs, len(queue)):
                    typical = statistics.median(took)
                    left = max(started[r] for r in procs) + typical - clock()
                    if abs(left) <= WAIT_SHARE * typical:
                        break   # the running seeds should end about now: this one starts then, with more threads
                s = queue.pop(0)
                procs[s], started[s] = _spawn(runs[s], threads or share, imports), clock()
            time.sleep(poll)
            for s, p in list(procs.items()):
                if p.poll() is None:
                    continue
                del procs[s]
                if p.returncode in MEMORY and s not in tried and (procs or queue or alone):
                    alone.append(s)
                elif p.returncode:
                    failed.append((s, p.returncode))
                else:
                    took.append(clock() - started[s])
    except KeyboardInterrupt:
        _end(procs.values())
        raise
    if failed and not stop.requested():   # after a stop, a seed that ended part-way is the stop's line's
        s, code = failed[0]
        raise ReslmError(f"seed {s}'s training process exited with status {code} (its run folder keeps its "
                         "checkpoint: run the bench again to continue)")


def _end(procs) -> None:
    """The seeds' processes still running, after an interrupt of this one: each asked to stop (SIGTERM: at the
    end of its step) and waited for; a second interrupt meanwhile asks again (at once) and still waits, so that
    no seed trains on after the bench has ended."""
    procs = [p for p in procs if p.poll() is None]
    for attempt in range(2):
        try:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait()
            return
        except KeyboardInterrupt:
            if attempt:
                raise


def _spawn(run_dir: Path, threads: int, imports: list[str]) -> subprocess.Popen:
    """One seed's training process (`_train_one`) with `threads` torch threads."""
    # in a process group of its own: Ctrl-C reaches the bench alone, which passes it on as a stop (`_parallel`)
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(threads), str(run_dir), *imports],
                            stdout=subprocess.DEVNULL, process_group=0)


_CHILD = "import sys; from reslm.frontier.bench import _train_one; sys.exit(_train_one(sys.argv[1:]))"


def _train_one(argv: list[str]) -> int:
    """One seed of a parallel bench, in its own process: argv is THREADS RUN_DIR [FILE.py ...] (a run whose
    config names its threads uses those). A SIGTERM (the bench passing on its stop) stops the training at the
    end of its step, as under the CLI (reslm.core.stop); a second one, or one before it trains, ends it at once
    with the interrupt's status and no traceback."""
    signal.signal(signal.SIGTERM, stop.on_sigterm)
    try:
        use_threads(int(argv[0]))
        _import(argv[2:])
        train(Path(argv[1]), progress=False)
    except (ReslmError, MemoryError) as e:   # out of memory: its own status, so that the parent runs it alone
        print(f"reslm: error: {e or 'out of memory'}", file=sys.stderr)
        return OutOfMemory.exit_status if isinstance(e, MemoryError) else getattr(e, "exit_status", 2)
    except KeyboardInterrupt:   # the checkpoint is written atomically: the last one is kept
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return stop.status(interrupted=True)
    return 0


def _card(reservoir, cfg: Config, base: Config, notes, sources, budget, runs, summaries, table, threads, jobs=1,
          flags=(), memory=(), wall: float | None = None) -> str:
    """card.md: what ran (the reservoir's source and its sha256, the recipe and what changed), where, every
    seed's figures, the references and (`memory`: reslm.frontier.profile.memory_lines) how far back it reads."""
    change = describe(delta(cfg.run_config(0), base.run_config(0)))
    L = [f"# Model card: {reservoir} in the reservoir frontier's recipe ({budget})", "",
         f"Made by `reslm frontier bench` (reslm {reslm.__version__}) on {cpu_name()}"
         + (f", {threads} thread{'s' if threads != 1 else ''} per run" if threads else "")
         + (f", {jobs} seeds at a time" if jobs > 1 else "") + "."
         + (f" The call took {wall / 60:.1f} min of wall time (the seeds it trained, the memory profile, "
            "the card)." if wall is not None else ""), "",
         f"- Reservoir: `{cfg.model['reservoir']}`" + "".join(f"; registered by `{s['path']}` (sha256 {s['sha256'][:16]})" for s in sources),
         f"- Recipe: the {RECIPE_PLAN} plan's choice ({base.label or 'base'}), changed: {', '.join(change) or 'nothing'}",
         f"- Strict reservoir rules: checked before training (fixed substrate, head reads the state only, "
         f"{summaries[next(iter(summaries))].get('trainable_params', 0):,} trainable parameters)",
         *[f"- Note: {n}" for n in notes], "",
         "## Runs", "", "| seed | folder | val CE | test CE (state carried) | bits/char | train time |", "|---|---|---|---|---|---|"]
    for s, d in runs.items():
        m = summaries[s]
        test = m.get(kept_of(TEST_LOSS), m.get(final_of(TEST_LOSS)))
        val = m.get(kept_of(VAL_LOSS), m.get(final_of(VAL_LOSS)))
        L.append(f"| {s} | `{d}` | {val if val is None else f'{val:.4f}'} | {test if test is None else f'{test:.4f}'} | "
                 f"{'-' if test is None else f'{test / LN2:.3f}'} | {m.get('train_seconds', 0) / 60:.1f} min |")
    seed = next(iter(runs))
    again = shlex.join(["reslm", "frontier", "bench", "--reservoir", reservoir,
                        *[w for s in sources for w in ("--import", path_word(s["path"]))],
                        *flags, "--budget", budget, "--seeds", str(seed), "--out", "DIR"]) if sources else \
        command(cfg.run_config(seed), out=str(runs[seed]))
    L += ["", "## Beside the references", "", table, "",
          "The references are published runs (results/), each the configuration its plan's rule chose on validation; "
          "every test CE scores the whole test shard with the state carried through it. Their training times are "
          "those of the machines that trained them (each run's provenance.json names its CPU).", "",
          f"Re-run one seed: `{again}`"]
    if memory:
        L += ["", "## Memory", "", *memory, "", f"![test CE against the characters read]({PLOT})"]
    return "\n".join(L) + "\n"


__all__ = ["BUDGETS", "CARD", "QUICK", "QUICK_PLAN", "RECIPE_PLAN", "bench", "bench_config", "parse_set",
           "quick_fields", "recipe_config", "source_name", "used_values"]
