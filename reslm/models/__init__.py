"""Model families and the paper's presets (Table 1).

MODELS maps a family name to (config class, model class); PRESETS maps a preset name to its family
and config overrides. `build_model(family, **fields)` is the one constructor everything uses.
"""
from __future__ import annotations


import torch

from reslm.errors import ReslmError
from reslm.models.aerc import AERC, AERCConfig
from reslm.models.base import build_config, config_dict, count_params
from reslm.models.rc import RC, RCConfig
from reslm.models.transformer import CharTransformer, TransformerConfig

MODELS = {
    "rc": (RCConfig, RC),
    "aerc": (AERCConfig, AERC),
    "tf": (TransformerConfig, CharTransformer),
}

# Table 1 of the paper (vocabulary 59, embedding 16), with the trainable-parameter count it reports.
PRESETS: dict[str, tuple[str, dict, int]] = {}
for _n, _p in [(250, 14809), (500, 29559), (750, 44309), (1750, 103309), (2600, 153459)]:
    PRESETS[f"rc-{_n}"] = ("rc", dict(size=_n), _p)
for (_n, _h), _p in zip([(75, 13), (75, 19), (100, 20), (150, 25), (160, 30)],
                        [15464, 31124, 45259, 102809, 155459]):
    PRESETS[f"aerc-{_n}-{_h}"] = ("aerc", dict(size=_n, hidden=_h), _p)
for (_f, _h, _l), _p in zip([(64, 4, 4), (72, 8, 8), (128, 8, 8), (356, 8, 8), (256, 16, 16)],
                            [15067, 30299, 45083, 105275, 155803]):
    PRESETS[f"tf-{_f}-{_h}-{_l}"] = ("tf", dict(ff_dim=_f, n_heads=_h, n_layers=_l), _p)


def make_config(family: str, **overrides):
    """The family's config with overrides applied and validated (ReslmError on unknown fields)."""
    if family not in MODELS:
        raise ReslmError(f"unknown model family {family!r} (known: {', '.join(MODELS)})")
    return build_config(MODELS[family][0], overrides, family)


def build_model(family: str, cfg=None, **overrides):
    cfg = cfg if cfg is not None else make_config(family, **overrides)
    return MODELS[family][1](cfg)


def preset(name: str) -> tuple[str, dict]:
    if name not in PRESETS:
        raise ReslmError(f"unknown preset {name!r} (see `reslm presets`)")
    family, cfg, _ = PRESETS[name]
    return family, dict(cfg)


def preset_table() -> list[dict]:
    """One row per preset: name, family, trainable/fixed parameter counts (measured on a shape-only
    model on the meta device, so no random matrices are drawn), the paper's count, the config."""
    rows = []
    for name, (family, overrides, paper) in PRESETS.items():
        cfg = make_config(family, **overrides)
        try:  # shape-only, so rc-2600 needs no eigenvalue solve; a family that can't do that is cheap
            with torch.device("meta"):
                model = build_model(family, cfg)
        except NotImplementedError:
            model = build_model(family, cfg)
        trainable, fixed = count_params(model)
        rows.append(dict(name=name, family=family, trainable_params=trainable, fixed_params=fixed,
                         paper_trainable_params=paper, config=config_dict(cfg)))
    return rows
