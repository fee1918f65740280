"""The registered substrates at the paper's largest reservoir budgets: the model overrides that put each
substrate into the rc and aerc families at rc-2600's and aerc-160-30's trainable budgets (`reslm lab`
trains them, `reslm bench` times them).

Lab substrate settings: the sizes fill the budget (nvar's size is fixed by k and the embedding size d:
1 + kd + kd(kd+1)/2, so d and k are chosen to come closest from below); every other knob is the
substrate's documented default or, where the character families' own defaults (spectral radius 0.9,
input scaling 2, tuned for the dense ESN) would be passed on, a value recorded here. They are starting
points, not tuned results: `reslm search` tunes a substrate's knobs.
"""
from __future__ import annotations

from reslm.models import PRESETS

BUDGET_PRESET = {"rc": "rc-2600", "aerc": "aerc-160-30"}   # the trainable budget of each family
# model overrides per substrate and family, on top of the family's preset (size, hidden)
SUBSTRATES: dict[str, dict[str, dict]] = {
    "esn": {"rc": {}, "aerc": {}},
    "leaky": {"rc": dict(reservoir_options="a_min=0.02"), "aerc": dict(reservoir_options="a_min=0.02")},
    "deep": {"rc": dict(reservoir_options="layers=3"), "aerc": dict(reservoir_options="layers=2")},
    "parallel": {"rc": dict(reservoir_options="leaks=1/0.2"), "aerc": dict(reservoir_options="leaks=1/0.2")},
    # 1 + kd + kd(kd+1)/2 <= N: d = 14, k = 5 -> 2,556 (rc); d = 8, k = 2 -> 153 (aerc)
    "nvar": {"rc": dict(size=2556, embed_dim=14, reservoir_options="k=5", input_scaling=1.0),
             "aerc": dict(size=153, embed_dim=8, reservoir_options="k=2", input_scaling=1.0)},
    "diagonal": {"rc": dict(spectral_radius=0.99, input_scaling=1.0, reservoir_options="nonlinear=true"),
                 "aerc": dict(spectral_radius=0.99, input_scaling=1.0, reservoir_options="nonlinear=true")},
    "delay": {"rc": dict(input_scaling=0.5), "aerc": dict(input_scaling=0.5)},
    "gru": {"rc": {}, "aerc": {}},   # the candidate's radius and input scaling as the esn's; gates at their defaults
    "poly": {"rc": {}, "aerc": {}},  # half the size an ESN, half fixed monomials of its state (the default)
    # the long-memory substrates (issue 70): ES2N at beta 0.1 with a random orthogonal map; the Legendre memory
    # (size = embed_dim x order: 16 x 162 = 2,592 and 16 x 10); the ESN beside, in half the units, a linear
    # diagonal memory with timescales log-uniform over 4-512 characters (halves of any even size, so it fits
    # whatever size a caller sets)
    "es2n": {"rc": dict(reservoir_options="beta=0.1"), "aerc": dict(reservoir_options="beta=0.1")},
    "legendre": {"rc": dict(size=2592, input_scaling=1.0, reservoir_options="theta=64"),
                 "aerc": dict(size=160, input_scaling=1.0, reservoir_options="theta=16")},
    "composite": {fam: dict(reservoir_options="parts=esn+diagonal(tau_min=4;tau_max=512;normalize=true)")
                  for fam in ("rc", "aerc")},
}


def model_overrides(substrate: str, family: str) -> dict:
    """The rc / aerc config of `substrate` at its family's budget (stream context mode)."""
    _, preset_model, _ = PRESETS[BUDGET_PRESET[family]]
    return {**preset_model, "reservoir": substrate, "context_mode": "stream", **SUBSTRATES[substrate][family]}
