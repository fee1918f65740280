"""Tokens -> reservoir states: a substrate's own knobs from one "key=value,key=value" string.

The character families (models/reservoir_lm.py) share a few reservoir fields (size, spectral_radius,
...); everything else a substrate has (leaky's a_min, deep's layers, ...) comes through
`reservoir_options`, e.g. "a_min=0.02,a_max=0.5". Each value is converted with its field's type
(int, float, bool, str); an unknown key or a bad value is a one-line ReslmError that lists the
substrate's options.
"""
from __future__ import annotations

from dataclasses import MISSING, fields

from reslm.core.errors import ReslmError

_TYPES = {"int": int, "float": float, "bool": bool, "str": str}
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _convert(kind: type, text: str):
    if kind is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(text)
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    return text


def parse_options(name: str, cfg_cls, text: str, reserved=()) -> dict:
    """{field: value} from "key=value,..." for reservoir `name`'s config class `cfg_cls`.

    `reserved` are fields the caller sets itself (size, input_dim, ...): naming one is an error too,
    so that a value never has two sources."""
    allowed = {f.name: f for f in fields(cfg_cls) if f.name not in reserved}
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = (p.strip() for p in item.partition("="))
        if not eq or not key:
            raise ReslmError(f"reservoir option {item!r} is not key=value (e.g. "
                             f"{next(iter(allowed), 'key')}=...)")
        if key not in allowed:
            hint = " (a model field: set it with its own flag)" if key in reserved else ""
            raise ReslmError(f"reservoir {name!r} has no option {key!r}{hint}; its options: "
                             f"{', '.join(allowed) or 'none'}")
        f = allowed[key]
        kind = _TYPES.get(f.type) if isinstance(f.type, str) else f.type
        if kind not in _TYPES.values():
            kind = type(f.default) if f.default is not MISSING else str
        try:
            out[key] = _convert(kind, value)
        except ValueError:
            raise ReslmError(f"reservoir option {key}={value!r} is not a valid {kind.__name__}") from None
    return out
