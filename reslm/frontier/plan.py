"""A frontier plan as data: a TOML file that names a base configuration (the incumbent), candidate
changes to it, the seeds, and the rule that chooses among them on the validation split.

    [plan]
    about = "the peak learning rate of the three-layer head, never chosen on validation"

    [base]                       # the incumbent: a preset (or family) with model and training overrides
    label = "mlp3-2c"
    preset = "rc-750"
    model = { head = "mlp3", head_hidden = 141 }
    train = { lr = 3e-3, schedule = "cosine", val_fraction = 0.05, val_split = "groups", keep_best_val = true }

    [rule]
    select = "screen"            # screen: every candidate at screen_seed; the `finalists` lowest on
    screen_seed = 0              # validation, if lower than the base there, go on to every seed; the
    seeds = [0, 1, 2]            # lowest mean validation CE over the seeds chooses. none: every
    finalists = 1                # configuration at every seed, nothing chosen (a refit, a seed study)
    strict = true                # every configuration obeys the strict reservoir rules and the budget

    [[candidate]]
    label = "lr1.5e-3"
    train = { lr = 1.5e-3 }      # the change, over the base (a candidate may also set model fields, and
                                 # name another preset of the base's family: its model fields, under the
                                 # base's and its own model changes)
    # full = { epochs_per_shard = 5, cycles = 2 }   a reduced-budget run's full budget (FULL_FIELDS: the
    #                              budget and its text per shard, and the lr, schedule, warm-up and EMA a quick
    #                              recipe replaces): the report ranks the plan's runs against the published runs
    #                              of their full budgets

Everything is checked before anything runs (`load_plan`): unknown keys and fields, values of the wrong
type, a candidate that breaks the strict rules or the budget, two candidates of one configuration.
A plan's `sha` is a sha256 of its file's text: the ledger (reslm.frontier.ledger) records which
plan text each run was started under.
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.models import PRESETS
from reslm.models.resolve import resolve
from reslm.models.budget import FRONTIER_BUDGET
from reslm.models.identity import check_label, fingerprint, recipe, run_name
from reslm.settings import TrainConfig

if sys.version_info >= (3, 11):
    import tomllib
else:   # pragma: no cover - Python 3.10
    import tomli as tomllib

BUNDLED = Path(__file__).resolve().parent / "plans"   # the plans reslm ships (`reslm frontier list`)
SELECTS = ("screen", "none")
MAX_SEEDS = 100          # seeds (and finalists) of one plan: each seed trains every configuration that goes on
SEED_MAX = 2**63 - 1     # a seed is a non-negative 64-bit integer, as on the command line
_KEYS = {"plan": {"about"}, "base": {"label", "preset", "family", "data", "model", "train", "full"},
         "rule": {"select", "screen_seed", "seeds", "finalists", "strict", "budget"},
         "candidate": {"label", "preset", "model", "train", "about", "full"}}
# fields a plan may not set: the seed is the rule's, where and how a run runs is the command line's
_NOT_IN_PLANS = {"seed", "threads", "device"}
# what a reduced budget's `full` may give back: the budget, and the schedule a quick recipe of its own replaces
FULL_FIELDS = ("epochs_per_shard", "cycles", "epoch_samples", "shard_chars", "lr", "schedule", "warmup_steps", "ema")


@dataclass(frozen=True)
class Config:
    """One configuration of a plan: the base or a candidate, as a run config without its seed."""
    label: str
    family: str
    preset: str | None
    data: str
    model: dict
    train: dict
    about: str = ""
    full: dict = field(default_factory=dict)   # a reduced budget's full training fields (a rank study)

    def run_config(self, seed: int) -> dict:
        """The config a run of this configuration at `seed` gets (the shape of a run's config.json)."""
        return dict(family=self.family, preset=self.preset, model={**self.model, "seed": seed},
                    train={**self.train, "seed": seed}, data=dict(name=self.data))

    def full_config(self) -> "Config | None":
        """The full-budget configuration a reduced-budget one stands for (None without `full`)."""
        return Config(**{**self.__dict__, "train": {**self.train, **self.full}, "full": {}}) if self.full else None

    def name(self, seed: int) -> str:
        """The run's folder name (reslm.models.identity.run_name)."""
        return run_name(self.run_config(seed), self.label)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.run_config(0))


@dataclass(frozen=True)
class Rule:
    select: str = "screen"
    screen_seed: int = 0
    seeds: tuple[int, ...] = (0, 1, 2)
    finalists: int = 1
    strict: bool = True
    budget: int = FRONTIER_BUDGET


@dataclass(frozen=True)
class Plan:
    name: str
    path: Path
    sha: str
    about: str
    base: Config
    candidates: tuple[Config, ...]
    rule: Rule
    text: str = field(repr=False, default="")

    @property
    def configs(self) -> tuple[Config, ...]:
        """The base, then the candidates."""
        return (self.base, *self.candidates)


def find_plan(name_or_path: str) -> Path:
    """A plan file: a path, or the name of a plan reslm ships (reslm/frontier/plans/NAME.toml). A folder, a
    FIFO or a device in its place is refused as what it is (a FIFO is never opened: it would block)."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if p.is_dir():
            raise ReslmError(f"plan {p} is a folder, not a plan file: give a .toml file or a plan's name")
        if p.exists() and not p.is_file():
            raise ReslmError(f"plan {p} is not a regular file (a FIFO, socket or device): give a .toml file")
        if not p.is_file():
            raise ReslmError(f"plan {p}: no such file")
        return p
    bundled = BUNDLED / f"{name_or_path}.toml"
    if not bundled.is_file():
        known = ", ".join(sorted(q.stem for q in BUNDLED.glob("*.toml")))
        raise ReslmError(f"no plan {name_or_path!r}: give a .toml file or one of {known}")
    return bundled


def bundled_plans() -> list[Path]:
    return sorted(BUNDLED.glob("*.toml"))


def load_plan(name_or_path: str | Path) -> Plan:
    """Read, check and resolve a plan file (ReslmError naming the file and what is wrong)."""
    path = find_plan(str(name_or_path))
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReslmError(f"plan {path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start:,})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ReslmError(f"plan {path}: not valid TOML ({e})") from None
    try:
        return _resolve(path, text, raw)
    except ReslmError as e:
        raise ReslmError(f"plan {path}: {e}") from None


def _keys(where: str, table, kind: str) -> dict:
    if not isinstance(table, dict):
        raise ReslmError(f"[{where}] must be a table")
    unknown = sorted(set(table) - _KEYS[kind])
    if unknown:
        raise ReslmError(f"[{where}] has unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS[kind]))})")
    return table


def _config(where: str, table: dict, base: Config | None) -> Config:
    for key in ("label", "preset", "family", "data", "about"):
        if key in table and not isinstance(table[key], str):
            raise ReslmError(f"[{where}] {key} must be a string, got {table[key]!r}")
    for part in ("model", "train"):
        if not isinstance(table.get(part, {}), dict):
            raise ReslmError(f"[{where}] {part} must be a table of fields")
        banned = sorted(_NOT_IN_PLANS & set(table.get(part, {})))
        if banned:
            raise ReslmError(f"[{where}] sets {', '.join(banned)}: seeds are the rule's, threads and device the "
                             "command line's")
    label = check_label(str(table.get("label", "")))
    if base is None:
        preset, fam = table.get("preset"), table.get("family")
        if preset is not None and preset not in PRESETS:
            raise ReslmError(f"[{where}] unknown preset {preset!r} (see `reslm presets`)")
        r = recipe(fam, preset) if (preset or fam) else None
        if r is None:
            raise ReslmError(f"[{where}] names no preset or family")
        fam, model, train, data = r["family"], dict(PRESETS[preset][1]) if preset else {}, {}, table.get("data", "shakespeare")
    else:
        fam, preset, model, train, data = base.family, base.preset, dict(base.model), dict(base.train), base.data
        if table.get("preset") not in (None, preset):
            preset, model = _other_preset(where, base, table["preset"])
    model.update(table.get("model", {}))
    train.update(table.get("train", {}))
    try:   # unknown fields and values of the wrong type: the model's and TrainConfig's own checks
        resolve(fam, model)
        TrainConfig(**{**recipe(fam)["train"], **train}).validate()
    except TypeError as e:
        raise ReslmError(f"[{where}] {e}") from None
    except ReslmError as e:
        raise ReslmError(f"[{where}] {e}") from None
    full = table.get("full", base.full if base is not None else {})
    if not isinstance(full, dict) or set(full) - set(FULL_FIELDS):
        raise ReslmError(f"[{where}] full gives the full budget's {', '.join(FULL_FIELDS)} only")
    try:   # the full budget's fields, typed and in range as the training fields they replace
        TrainConfig(**{**recipe(fam)["train"], **train, **full}).validate()
    except ReslmError as e:
        raise ReslmError(f"[{where}] full: {e}") from None
    return Config(label=label, family=fam, preset=preset, data=str(data), model=model, train=train,
                  about=str(table.get("about", "")), full=dict(full))


def _other_preset(where: str, base: Config, preset: str) -> tuple[str, dict]:
    """A candidate's own preset (of the base's family): its model fields with the base's changes over them."""
    if preset not in PRESETS or PRESETS[preset][0] != base.family:
        raise ReslmError(f"[{where}] preset {preset!r} is not a {base.family} preset (see `reslm presets`)")
    own = PRESETS[base.preset][1] if base.preset else {}
    changes = {k: v for k, v in base.model.items() if k not in own or own[k] != v}
    return preset, {**PRESETS[preset][1], **changes}


def _rule(table: dict) -> Rule:
    """The [rule] table as a Rule, each field checked for its type and range first (TOML gives any type)."""
    def integer(key: str, lo: int, hi: int) -> int:
        v = table.get(key, getattr(Rule, key))
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ReslmError(f"[rule] {key} must be an integer from {lo:,} to {hi:,}, got {v!r}")
        return v
    seeds = table.get("seeds", Rule.seeds)
    if not isinstance(seeds, (list, tuple)) or not seeds:
        raise ReslmError(f"[rule] seeds must be a list of seeds such as [0, 1, 2], got {seeds!r}")
    if len(seeds) > MAX_SEEDS:
        raise ReslmError(f"[rule] seeds lists {len(seeds):,} seeds; a plan takes at most {MAX_SEEDS} (each seed "
                         "is a training of every configuration that goes on)")
    if any(not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= SEED_MAX for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise ReslmError(f"[rule] seeds must be distinct integers from 0 to {SEED_MAX:,}, got {list(seeds)}")
    select = table.get("select", Rule.select)
    if select not in SELECTS:
        raise ReslmError(f"[rule] select must be one of {', '.join(SELECTS)}, got {select!r}")
    strict = table.get("strict", Rule.strict)
    if not isinstance(strict, bool):
        raise ReslmError(f"[rule] strict must be true or false, got {strict!r}")
    rule = Rule(select=select, screen_seed=integer("screen_seed", 0, SEED_MAX), seeds=tuple(seeds),
                finalists=integer("finalists", 1, MAX_SEEDS), strict=strict, budget=integer("budget", 1, 10**12))
    if rule.select == "screen" and rule.screen_seed not in rule.seeds:
        raise ReslmError(f"[rule] screen_seed {rule.screen_seed} is not one of the seeds {list(rule.seeds)}")
    return rule


def _check(plan_rule: Rule, c: Config, where: str) -> None:
    """A configuration's verdict under the plan's rules: strict reservoir family and budget."""
    if c.train.get("val_fraction", 0) <= 0 and plan_rule.select == "screen":
        raise ReslmError(f"[{where}] has no validation split (train.val_fraction): the rule chooses on validation")
    if plan_rule.strict:
        verdict = resolve(c.family, c.model).frontier
        over = verdict.trainable_params > plan_rule.budget
        reasons = [r for r in verdict.reasons if "over the budget" not in r] + (
            [f"{verdict.trainable_params:,} trainable parameters, over the plan's budget of {plan_rule.budget:,}"]
            if over else [])
        if reasons:
            raise ReslmError(f"[{where}] breaks the strict rules: {'; '.join(reasons)}")


def _resolve(path: Path, text: str, raw: dict) -> Plan:
    unknown = sorted(set(raw) - {"plan", "base", "rule", "candidate"})
    if unknown:
        raise ReslmError(f"unknown table(s) {', '.join(unknown)} (known: plan, base, rule, candidate)")
    about = _keys("plan", raw.get("plan", {}), "plan").get("about", "")
    if not isinstance(about, str):
        raise ReslmError(f"[plan] about must be a string, got {about!r}")
    if "base" not in raw:
        raise ReslmError("no [base] table: the configuration the candidates change")
    base = _config("base", _keys("base", raw["base"], "base"), None)
    rule = _rule(_keys("rule", raw.get("rule", {}), "rule"))
    items = raw.get("candidate", [])
    if not isinstance(items, list):
        raise ReslmError("candidates are [[candidate]] tables")
    candidates = tuple(_config(f"candidate {i + 1}", _keys(f"candidate {i + 1}", t, "candidate"), base)
                       for i, t in enumerate(items))
    seen: dict[str, str] = {}
    for i, c in enumerate((base, *candidates)):
        where = "base" if i == 0 else f"candidate {i} ({c.label or 'no label'})"
        if i and not c.label:
            raise ReslmError(f"[{where}] needs a label (its name in folder names and tables)")
        _check(rule, c, where)
        if c.fingerprint in seen:
            raise ReslmError(f"[{where}] is the same configuration as {seen[c.fingerprint]}")
        seen[c.fingerprint] = where
    labels = [c.label for c in candidates]
    if len(set(labels)) != len(labels):
        raise ReslmError("two candidates share a label")
    return Plan(name=path.stem, path=path, sha=hashlib.sha256(text.encode()).hexdigest(), about=str(about),
                base=base, candidates=candidates, rule=rule, text=text)


__all__ = ["BUNDLED", "Config", "Plan", "Rule", "bundled_plans", "find_plan", "load_plan"]
