"""A model configuration resolved once: a family (or a preset) and overrides in; a complete, validated config
out, which answers what the rest of reslm asks of a configuration before anything is drawn, without
resolving it again.

    make_config(family, **overrides)   the family's config: implied fields completed (complete_fields), every
                         field checked against its type (build_config), then the config's own validate()
    build_model(family, cfg)           the model of a config (or of overrides)
    spec = resolve("rc", {"size": 750})        or resolve(preset="rc-750"); vocab_size defaults to CHAR_VOCAB
    spec.config          the family's config: implied fields completed (complete_fields), every field checked
    spec.fields          its fields as a plain dict (a run config's "model")
    spec.shape           the model built shape-only on the meta device, once: nothing drawn or allocated
    spec.frontier        the strict rules' verdict on it (reslm.models.budget.check_frontier)
    spec.bytes           what its parameters and buffers take (reslm.models.load.check_fits holds it against memory)
    spec.replace(**f)    the same configuration with fields changed, resolved anew

A run's whole configuration (this spec, the training fields, the dataset) is reslm.train.config.make_run_config's;
its identity and fingerprint are reslm.models.identity's.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from functools import cached_property

import torch

from reslm.core.errors import ReslmError
from reslm.models.base import config_dict
from reslm.models.budget import Frontier, check_frontier
from reslm.models.registry import family
from reslm.models.registry import preset as preset_of
from reslm.reservoir import RESERVOIRS

_VERDICTS: dict[tuple, Frontier] = {}   # ModelSpec.frontier's, one per configuration

CHAR_VOCAB = 59   # the Shakespeare characters (the paper's vocabulary): a plan's or the bench's configuration
                  # is resolved at it before its dataset is opened


_KINDS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}


def _checked_value(family: str, f, v):
    """v for field f, checked against the type of f's default (an int for an int field, never a bool;
    a finite float or an int, made a float, for a float field; a str; a bool); ReslmError otherwise.
    Fields whose default is of another type (or that have none) are left to validate()."""
    want = type(f.default)
    if want not in _KINDS:
        return v
    if want is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    ok = type(v) is want and (want is not float or math.isfinite(v))
    if not ok:
        shown = repr(v)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise ReslmError(f"{family} option {f.name} must be {_KINDS[want]}, got {shown}")
    return v


def build_config(cfg_cls, overrides: dict, family: str):
    """cfg_cls(**overrides), validated; ReslmError naming any field the family does not have, and any
    value not of its field's type (a config.json edited by hand, `--input-scaling nan`)."""
    unknown = sorted(set(overrides) - {f.name for f in fields(cfg_cls)})
    if unknown:
        raise ReslmError(f"unknown {family} option(s): {', '.join(unknown)}")
    by_name = {f.name: f for f in fields(cfg_cls)}
    overrides = {k: _checked_value(family, by_name[k], v) for k, v in overrides.items()}
    cfg = cfg_cls(**overrides)
    cfg.validate()
    return cfg


def complete_fields(name: str, overrides: dict) -> dict:
    """Model fields as the family's config takes them: a config with `complete` adds what is implied
    (the reservoir LMs: the fields a substrate fixes itself) and renames what was renamed (LAERC: the
    fields of run configs written before, under their current names)."""
    return _completed(family(name).config, overrides)


def _completed(cls, overrides: dict) -> dict:
    return cls.complete(overrides) if hasattr(cls, "complete") else overrides


def make_config(name: str, **overrides):
    """The family's config with overrides applied (complete_fields) and validated (ReslmError on
    unknown fields)."""
    cls = family(name).config
    return build_config(cls, _completed(cls, overrides), name)


def build_model(name: str, cfg=None, **overrides):
    """The family's model from a config (or from overrides of its defaults)."""
    cfg = cfg if cfg is not None else make_config(name, **overrides)
    return family(name).model(cfg)


def check_frontier_config(name: str, cfg) -> Frontier:
    """check_frontier of the model a family config describes, built shape-only on the meta device
    (no random matrices drawn, so a large reservoir costs nothing to check)."""
    return ModelSpec(name, cfg).frontier


@dataclass(frozen=True, eq=False)
class ModelSpec:
    family: str
    config: object                # the family's config dataclass, complete and validated
    preset: str | None = None

    @property
    def fields(self) -> dict:
        return config_dict(self.config)

    @cached_property
    def shape(self) -> torch.nn.Module:
        with torch.device("meta"):
            return build_model(self.family, self.config)

    @cached_property
    def frontier(self) -> Frontier:
        # one verdict per configuration in a process (a report reads hundreds of runs of a few dozen), keyed
        # by its fields but the seed (which draws values, not shapes or what is trained) and by the classes
        # that build it (an --import may register a name anew)
        key = (self.family, family(self.family).model, tuple(RESERVOIRS.items()),
               json.dumps({k: v for k, v in self.fields.items() if k != "seed"}, sort_keys=True, default=repr))
        if key not in _VERDICTS:
            _VERDICTS[key] = check_frontier(self.shape)
        return _VERDICTS[key]

    @cached_property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.shape.parameters(), *self.shape.buffers()))

    def replace(self, **changes) -> "ModelSpec":
        return resolve(self.family, {**self.fields, **changes}, preset=self.preset)


def resolve(family_name: str | None = None, overrides: dict | None = None, *, preset: str | None = None,
            vocab_size: int | None = None) -> ModelSpec:
    """The ModelSpec of a family (or a preset's family and values) with `overrides` over it; vocab_size from
    `vocab_size`, else the overrides', else CHAR_VOCAB. ReslmError naming an unknown preset or family, an
    unknown field or a value of the wrong type."""
    base = {}
    if preset is not None:
        family_name, base = preset_of(preset)
    elif family_name is None:
        raise ReslmError("a model configuration names a preset or a family")
    fields = {**base, **(overrides or {})}
    fields["vocab_size"] = vocab_size if vocab_size is not None else fields.get("vocab_size", CHAR_VOCAB)
    return ModelSpec(family_name, make_config(family_name, **fields), preset)


__all__ = ["CHAR_VOCAB", "ModelSpec", "build_config", "build_model", "check_frontier_config", "complete_fields",
           "make_config", "resolve"]
