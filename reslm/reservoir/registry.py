"""The substrates by name: RESERVOIRS, key -> (config class, reservoir class).

reslm.reservoir fills it with the substrates reslm ships; a user's code adds its own
(`RESERVOIRS["mine"] = (MyConfig, MyReservoir)`), and the models, the composite substrate's parts
(composite.py) and the command line read it when a configuration names a substrate. It lives in a module
of its own so that a substrate built from others can read it without importing the package that fills it.
"""
from __future__ import annotations

RESERVOIRS: dict[str, tuple] = {}
