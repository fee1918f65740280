"""What identifies a run, in one place: which of its config's fields make it another configuration,
how it differs from a base, the folder name derived from that, and the `reslm train` command that makes it.

Each training field declares its role (reslm.settings.ROLES): *identity* (another value is another
configuration), *seed*, *record* (what is logged) or *resource* (where and on how many threads it runs).
Every model field is identity, except the seed. A run config written before a field existed reads as
that field's default today, so an old run compares as the configuration it was.

    identity(cfg)          the configuration of a run config: family, data, model and training fields
    recipe(family, ...)    a base: a family or preset with overrides (default: the paper's protocol)
    delta(cfg, base)       {"model": {...}, "train": {...}}: the fields where cfg differs from base
    same_run_problem(a, b) why config a is not the run config b asks for (a resumed sweep, reproduction)
    fingerprint(cfg)       8 hex digits over the configuration (seed aside)
    run_name(cfg, label)   the folder name of a new run: STEM[-LABEL]-FINGERPRINT-sSEED
    name_problem(name, cfg)  why a folder's name does not describe its config (None when it does)
    command(cfg)           a `reslm train` command line that makes the run (command_words: its words)
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import shlex
from dataclasses import asdict

from reslm.core.errors import ReslmError
from reslm.core.shell import path_word
from reslm.models import PRESETS, family, make_config
from reslm.models.base import config_dict
from reslm.settings import TrainConfig, field_roles

NOT_MODEL_IDENTITY = ("seed", "vocab_size")   # the seed's role is seed; the vocabulary is the dataset's
NAME_RE = re.compile(r"^(?P<head>.+)-(?P<fp>[0-9a-f]{8})-s(?P<seed>\d+)$")   # a derived folder name
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$")


def train_defaults(family_name: str) -> dict:
    """Every training field at the family's default (TrainConfig's, then the family's overrides)."""
    return {**_train_config_defaults(), **family(family_name).train}


@functools.cache
def _train_config_defaults() -> dict:
    """TrainConfig's defaults, made once (every field is a number, a string, a bool or None: nothing to share)."""
    return asdict(TrainConfig())


def model_defaults(family_name: str, preset: str | None = None) -> dict:
    """Every model field of the family's config at its default, or at the preset's values."""
    over = dict(PRESETS[preset][1]) if preset in PRESETS else {}
    return config_dict(make_config(family_name, **over))


def _model(cfg: dict) -> dict:
    """The run's model fields under today's names, with the fields added since at their defaults."""
    model = cfg.get("model") or {}
    try:
        return config_dict(make_config(cfg["family"], **model))
    except ReslmError:   # fields a build refuses (vocab_size 0 in a recipe): compared as written
        return {**model_defaults(cfg["family"]), **model}


def _train(cfg: dict) -> dict:
    """The run's training fields, the fields added since at their defaults."""
    return {**train_defaults(cfg["family"]), **(cfg.get("train") or {})}


def identity(cfg: dict) -> dict:
    """The configuration a run config describes: its family, dataset name, every identity model field
    and training field (seed, record and resource fields aside), with today's defaults for fields the
    config predates. Two runs of one configuration at two seeds have equal identities."""
    roles = field_roles()
    return dict(family=cfg["family"], data=_data_name(cfg),
                model={k: v for k, v in _model(cfg).items() if k not in NOT_MODEL_IDENTITY},
                train={k: v for k, v in _train(cfg).items() if roles.get(k, "identity") == "identity"})


def _data_name(cfg: dict) -> str | None:
    data = cfg.get("data") or {}
    return data.get("name") or data.get("path")


def seed_of(cfg: dict) -> int:
    return int((cfg.get("train") or {}).get("seed", 0))


def recipe(family_name: str | None = None, preset: str | None = None, model: dict | None = None,
           train: dict | None = None, data: str | None = None) -> dict:
    """A base to compare runs with, in the run config's shape: a preset (or family) at its defaults,
    which are the paper's protocol for the character families, then `model` and `train` overrides."""
    if preset is not None:
        if preset not in PRESETS:
            raise ReslmError(f"unknown preset {preset!r} (see `reslm presets`)")
        family_name = PRESETS[preset][0]
    if family_name is None:
        raise ReslmError("a recipe names a preset or a family")
    base_model = {**model_defaults(family_name, preset), **(model or {})}
    return dict(family=family_name, preset=preset, model=base_model,
                train={**train_defaults(family_name), **(train or {})}, data=dict(name=data))


def paper_base(cfg: dict) -> dict:
    """The paper's protocol for the run's preset (or family): the base a run is described against."""
    preset = cfg.get("preset") if cfg.get("preset") in PRESETS else None
    return recipe(cfg["family"], preset)


def delta(cfg: dict, base: dict | None = None, *, ignore=()) -> dict:
    """{"model": {field: value}, "train": {field: value}}: the identity fields where `cfg` differs from
    `base` (a run config or a `recipe`; default: the paper's protocol for its preset), in field order.
    Fields in `ignore` are left out. Configs of two families have no delta: ReslmError."""
    base = paper_base(cfg) if base is None else base
    if base["family"] != cfg["family"]:
        raise ReslmError(f"a {cfg['family']} run has no delta from a {base['family']} recipe")
    have, want = identity(cfg), identity(base)
    return {part: {k: v for k, v in have[part].items() if k not in ignore and want[part].get(k) != v}
            for part in ("model", "train")}


def same_run_problem(have: dict, want: dict) -> str | None:
    """Why run config `have` is not the run `want` asks for (None when it is): "a different model" (family,
    model fields or seed), or "a different budget (fields)" (identity training fields). Where and on how
    many threads it runs, and what it logs, may differ."""
    a, b = identity(have), identity(want)
    if a["family"] != b["family"] or a["model"] != b["model"] or \
            (have.get("model") or {}).get("seed", 0) != (want.get("model") or {}).get("seed", 0):
        return "a different model"
    diff = sorted(k for k in set(a["train"]) | set(b["train"]) if a["train"].get(k) != b["train"].get(k))
    diff += ["seed"] if seed_of(have) != seed_of(want) else []
    return f"a different budget ({', '.join(diff)})" if diff else None


def describe(d: dict) -> list[str]:
    """A delta as "field=value" texts, model fields first."""
    return [f"{k}={_text(v)}" for part in ("model", "train") for k, v in d[part].items()]


def _text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def fingerprint(cfg: dict, *, ignore=()) -> str:
    """8 hex digits of a sha256 over the configuration: family, dataset name and the delta from the
    family's defaults (so a field added later, at its default, changes no fingerprint); seed aside."""
    d = delta(cfg, recipe(cfg["family"]), ignore=ignore)
    body = dict(family=cfg["family"], data=_data_name(cfg), **d)
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:8]


def check_label(label: str) -> str:
    if label and not LABEL_RE.match(label):
        raise ReslmError(f"label {label!r}: letters, digits and . + _ - only, starting with a letter or digit")
    return label


def _stem(cfg: dict) -> str:
    """The run's preset where its model still is that preset's (size fields as the preset has them), else
    its family: an rc-750 recipe grown to 1,500 units is an rc run, not an rc-750 one."""
    preset = cfg.get("preset")
    if preset in PRESETS and all(_model(cfg).get(k) == v for k, v in PRESETS[preset][1].items()):
        return preset
    return cfg["family"]


def run_name(cfg: dict, label: str = "") -> str:
    """The folder name of a run: its preset (or family), an optional label (a plan's name for the change,
    free text, not checked), its configuration's fingerprint and its seed: rc-750-lr1.5e-3-3f9a2c1b-s0.
    Deterministic: the same config gives the same name, and any identity field changes it."""
    stem = _stem(cfg)
    return "-".join(p for p in (stem, check_label(label), fingerprint(cfg), f"s{seed_of(cfg)}") if p)


# --- folders named before run_name: the words of their names that say something checkable -----------
def _near(a: float, b) -> bool:
    return isinstance(b, (int, float)) and abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-30)


_LEGACY = (   # (pattern over "-name-", what its match says of the config (None: nothing wrong), in words)
    (r"-(?:s|seed)(\d+)-$", lambda m, c: None if seed_of(c) == int(m[1]) else f"seed {seed_of(c)}"),
    (r"-(\d+)c-", lambda m, c: None if _train(c)["cycles"] == int(m[1]) else f"cycles {_train(c)['cycles']}"),
    (r"-cos(\d+(?:\.\d+)?e-\d+)-", lambda m, c: None if _train(c)["schedule"] == "cosine" and
     _near(float(m[1]), _train(c)["lr"]) else f"schedule {_train(c)['schedule']}, lr {_train(c)['lr']:g}"),
    (r"-ema(0\.\d+)?-", lambda m, c: None if _train(c)["ema"] and (not m[1] or _near(float(m[1]), _train(c)["ema"]))
     else f"ema {_train(c)['ema']:g}"),
    (r"-gval-", lambda m, c: None if _train(c)["val_fraction"] and _train(c)["val_split"] == "groups"
     else f"val_split {_train(c)['val_split']}, val_fraction {_train(c)['val_fraction']:g}"),
    (r"-val-", lambda m, c: None if _train(c)["val_fraction"] and _train(c)["val_split"] == "tails"
     else f"val_split {_train(c)['val_split']}, val_fraction {_train(c)['val_fraction']:g}"),
    (r"-(stream|window|causal)-", lambda m, c: None if _model(c).get("context_mode", "window") == m[1]
     else f"context_mode {_model(c).get('context_mode', 'window')}"),
    (r"-mlp([23])?-?(\d+)-", lambda m, c: None if _model(c).get("head") == f"mlp{m[1] or ''}" and
     _model(c).get("head_hidden") == int(m[2]) else f"head {_model(c).get('head')} {_model(c).get('head_hidden')}"),
    (r"-wd(\d+(?:\.\d+)?)-", lambda m, c: None if _near(float(m[1]), _train(c)["weight_decay"])
     else f"weight_decay {_train(c)['weight_decay']:g}"),
    (r"-drop(\d+(?:\.\d+)?)-", lambda m, c: None if _near(float(m[1]), _model(c).get("head_dropout"))
     else f"head_dropout {_model(c).get('head_dropout')}"),
    (r"-indrop(\d+(?:\.\d+)?)-", lambda m, c: None if _near(float(m[1]), _model(c).get("head_input_dropout"))
     else f"head_input_dropout {_model(c).get('head_input_dropout')}"),
)


def name_problem(name: str, cfg: dict) -> str | None:
    """Why a published folder's name does not describe its config, or None. A derived name (run_name)
    is checked whole: stem, fingerprint and seed. An older name is checked word by word where a word
    says something (-s1 / -seed1, -2c, -cos3e-3, -ema0.9999, -gval, -val, -stream, -mlp3-141, -wd0.1,
    -drop0.1, -indrop0.1, a leading preset name); the rest of it is free text."""
    m = NAME_RE.match(name)
    if m:
        stem = _stem(cfg)
        if not (m["head"] == stem or m["head"].startswith(stem + "-")):
            return f"the name's stem is not {stem}"
        if m["fp"] != fingerprint(cfg):
            return f"the name's fingerprint {m['fp']} is not its config's {fingerprint(cfg)}"
        return None if int(m["seed"]) == seed_of(cfg) else f"the name says seed {m['seed']}, the config {seed_of(cfg)}"
    lead = next((p for p in sorted(PRESETS, key=len, reverse=True) if name == p or name.startswith(p + "-")), None)
    if lead and lead != cfg.get("preset") and any(_model(cfg).get(k) != v for k, v in PRESETS[lead][1].items()):
        return f"the name starts with {lead}, the config is {cfg.get('preset') or cfg['family']}"
    text = f"-{name}-"
    for pattern, check in _LEGACY:
        hit = re.search(pattern, text)
        # "-val-" inside "-gval-" is not a tails split; "-drop" inside "-indrop" is the input dropout
        if hit and not (pattern == r"-val-" and "-gval-" in text) and (problem := check(hit, cfg)):
            return f"the name says {hit[0].strip('-')}, the config {problem}"
    return None


# --- the command that makes a run ------------------------------------------------------------------
def _flag(name: str, value) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    return [flag, json.dumps(value) if isinstance(value, (dict, list)) else _text(value) if isinstance(value, float)
            else str(value)]


def command(cfg: dict, *, out: str | None = None, extra: dict | None = None) -> str:
    """A `reslm train` command line that makes the run of `cfg` (command_words, each word shell-quoted)."""
    return " ".join(shlex.quote(a) for a in command_words(cfg, out=out, extra=extra))


def command_words(cfg: dict, *, out: str | None = None, extra: dict | None = None) -> list[str]:
    """The words of a `reslm train` command that makes the run of `cfg`: its preset (or family), the identity
    fields that differ from the preset's defaults (delta), its dataset and seed, then `extra` flags
    (given whatever their value: threads, or an optimizer named even at its default) and --out."""
    d = delta(cfg)
    args = ["reslm", "train"] + (["--preset", cfg["preset"]] if cfg.get("preset") in PRESETS
                                 else ["--family", cfg["family"]])
    for part in ("model", "train"):
        for k, v in d[part].items():
            if k not in (extra or {}):
                args += _flag(k, v)
    if _data_name(cfg):
        args += ["--data", _data_name(cfg)]
    args += ["--seed", str(seed_of(cfg))] if seed_of(cfg) else []
    for k, v in (extra or {}).items():
        args += _flag(k, v)
    args += ["--out", path_word(out)] if out else []
    return args


__all__ = ["command", "command_words", "delta", "describe", "same_run_problem", "fingerprint", "identity", "model_defaults", "name_problem", "paper_base",
           "recipe", "run_name", "seed_of", "train_defaults"]
