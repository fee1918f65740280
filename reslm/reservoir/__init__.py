"""Tokens -> reservoir states: fixed dynamical systems that turn input vectors into states.

Any reservoir plugs into the reservoir language models (models/reservoir_lm.py) and into LAERC's
blocks (models/laerc.py) if it provides

    size                                  int, state dimension N
    input_dim                             int, input vector size d
    init_state(batch, device, dtype)      -> (B, N) initial state
    forward(u (B,T,d), s0 (B,N) | None)   -> (states (B,T,N), s_T (B,N)); fixed weights (buffers)
    step(u_t (B,d), s (B,N))              -> next state (B,N)

and is registered in RESERVOIRS under a name (ReservoirLMConfig.reservoir, LAERCConfig.reservoir)
with a dataclass config that has at least `size`, `input_dim` and `seed` (and `validate()`); the
models fill whichever of the ESNConfig field names it also has (spectral_radius, radius_norm,
input_scaling, bias_scaling, dtype, ...). The weights never train; a reservoir that lets autograd
through its recurrence when u requires grad (as ESN does) also serves LAERC's reservoir_grad. A
physical substrate fits the same mould: `forward` sends the inputs to the device and returns what
it measured.

Substrates (RESERVOIRS key: module, config, knobs beyond size / input_dim / seed). The character
families set size, spectral_radius, input_scaling, leak_rate, density, input_density, bias_scaling and
seed from their own fields and the rest through `reservoir_options` ("key=value,...", options.py).

    esn       esn.py       ESNConfig        tanh ESN (paper eq. 1): spectral_radius, radius_norm,
                                            input_scaling, input_init, leak_rate, density, input_density,
                                            bias_scaling, dtype, backend
    leaky     leaky.py     LeakyESNConfig   ESN with per-unit leak rates, log-uniform in [a_min, a_max]
                                            (memory from one character to ~1/a_min); a_min = a_max = 1
                                            is the ESN
    deep      deep.py      DeepESNConfig    `layers` stacked ESNs, N split evenly, state = all layers;
                                            inter_scaling for layers 2..L; layers = 1 is the ESN
    parallel  parallel.py  ParallelESNConfig  ESNs side by side, all reading the input, one leak rate
                                            each: leaks (e.g. 1/0.2), shares (relative sizes, e.g.
                                            2/1), radii and scalings (per-block spectral radius
                                            and input scaling); one block is the ESN
    nvar      nvar.py      NVARConfig       next-generation RC: [1, last k inputs, their quadratic
                                            monomials], no recurrence; k, input_scaling; size must be
                                            1 + k d + k d (k d + 1) / 2
    diagonal  diagonal.py  DiagonalConfig   linear complex-diagonal reservoir, |lambda| ~ U(r_min,
                                            spectral_radius) or exp(-1/tau) with tau log-uniform in
                                            [tau_min, tau_max] characters, arg ~ U(0, angle_max),
                                            chunked log-depth scan over time: r_min, input_scaling,
                                            normalize (the LRU's sqrt(1 - |lambda|^2) input gain),
                                            nonlinear (+ tanh(M x) features), mix_scaling, chunk (0 =
                                            auto: loop on CPU)
    delay     delay.py     DelayConfig      one Mackey-Glass / Ikeda node with delayed feedback, N
                                            virtual nodes: eta, node_coupling, nonlinearity, p, phi,
                                            mask, input_scaling (gamma)
    poly      poly.py      PolyESNConfig    an ESN of size - products units beside `products` fixed
                                            quadratic monomials x_i x_j of its state (pairs drawn from
                                            the seed; 0 = half the size): the ESN's knobs
    gru       gru.py       GRUConfig        frozen random GRU (torch's gate equations, fixed weights):
                                            spectral_radius (the candidate's W_hn, the ESN's W),
                                            radius_norm, input_scaling, input_init, bias_scaling,
                                            gate_scaling, update_bias, dtype
    es2n      es2n.py      ES2NConfig       edge-of-stability ESN: x = beta tanh(W x + W_in u + b) +
                                            (1 - beta) O x, O fixed orthogonal: beta, orthogonal
                                            (random | cycle | identity), and the ESN's knobs
    legendre  legendre.py  LegendreConfig   the LMU's Legendre delay memory (fixed, linear, ZOH) of
                                            each input dimension, a Toeplitz-chunked scan: theta
                                            (window in characters), order (size = input_dim x order),
                                            input_scaling, normalize, chunk
    composite composite.py CompositeConfig  registered substrates side by side in one state: parts
                                            (e.g. esn:1500(input_init=normal)+legendre(theta=64)),
                                            each part seeded from its own child key
    recorded  recorded.py  RecordedConfig   states a physical device measured, replayed from a file
                                            (`reslm substrate import`): path; size and embed_dim come
                                            from the file; stream context only, cannot generate

LAERC's blocks take any of them whose size fits R = r_mult D (nvar's feature count rarely does; the
diagonal reservoir needs an even R unless nonlinear; a recording serves rc / aerc only).

What a substrate can do beyond that is stated, not probed for: its reservoir class subclasses
base.Reservoir and its config class base.ReservoirConfig, whose class attributes it overrides where it
differs: `pure` (forward depends on its arguments only: window states may share prefixes), `drivable`
(False: cannot read new input, so no generation), `replays` (its states are read from a recording by
`replay(tokens, offset)`, which ReservoirLM.features uses in place of computing them); the config's
`context_modes` (the context modes it supports) and `implied(options) -> {field: value}` (reservoir-LM
fields it fixes itself, applied by ReservoirLMConfig.complete).
"""
from reslm.reservoir.base import Reservoir, ReservoirConfig
from reslm.reservoir.esn import ESN, KNOBS, ESNConfig, ReservoirKnobs, tanh_recurrence
from reslm.core.radii import recorded_radii, remember_radii
from reslm.reservoir.matrices import random_sparse, scale_radius, scale_spectral_radius, spectral_radius
from reslm.reservoir.seeding import child_seed, generator
from reslm.reservoir.states import CONTEXT_MODES, shard_states
from reslm.reservoir.leaky import LeakyESN, LeakyESNConfig
from reslm.reservoir.deep import DeepESN, DeepESNConfig
from reslm.reservoir.parallel import ParallelESN, ParallelESNConfig
from reslm.reservoir.nvar import NVAR, NVARConfig
from reslm.reservoir.diagonal import DiagonalConfig, DiagonalReservoir
from reslm.reservoir.delay import DelayConfig, DelayReservoir
from reslm.reservoir.gru import FrozenGRU, GRUConfig
from reslm.reservoir.poly import PolyESN, PolyESNConfig
from reslm.reservoir.options import parse_options
from reslm.reservoir.recorded import RecordedConfig, RecordedReservoir
from reslm.reservoir.es2n import ES2N, ES2NConfig
from reslm.reservoir.legendre import LegendreConfig, LegendreMemory
from reslm.reservoir.composite import Composite, CompositeConfig
from reslm.reservoir.registry import RESERVOIRS

RESERVOIRS.update({"esn": (ESNConfig, ESN), "leaky": (LeakyESNConfig, LeakyESN), "deep": (DeepESNConfig, DeepESN),
              "parallel": (ParallelESNConfig, ParallelESN), "nvar": (NVARConfig, NVAR), "diagonal": (DiagonalConfig, DiagonalReservoir),
              "delay": (DelayConfig, DelayReservoir), "gru": (GRUConfig, FrozenGRU), "poly": (PolyESNConfig, PolyESN),
              "es2n": (ES2NConfig, ES2N), "legendre": (LegendreConfig, LegendreMemory),
              "composite": (CompositeConfig, Composite), "recorded": (RecordedConfig, RecordedReservoir)})

def model_radii(model) -> dict[str, float]:
    """{radius name: radius} of every reservoir matrix of `model` that was scaled to a radius."""
    return recorded_radii(sorted({m.radius_name for m in model.modules() if hasattr(m, "radius_name")}))


__all__ = ["Reservoir", "ReservoirConfig", "ReservoirKnobs", "KNOBS", "ESN", "ESNConfig", "RESERVOIRS", "CONTEXT_MODES", "shard_states", "spectral_radius",
           "scale_spectral_radius", "scale_radius", "random_sparse", "recorded_radii", "remember_radii", "model_radii", "tanh_recurrence", "child_seed",
           "generator", "LeakyESN", "LeakyESNConfig", "DeepESN", "DeepESNConfig", "ParallelESN", "ParallelESNConfig", "NVAR", "NVARConfig",
           "DiagonalReservoir", "DiagonalConfig", "DelayReservoir", "DelayConfig", "FrozenGRU", "GRUConfig", "PolyESN", "PolyESNConfig", "RecordedConfig",
           "RecordedReservoir", "parse_options", "ES2N", "ES2NConfig", "LegendreMemory", "LegendreConfig", "Composite",
           "CompositeConfig"]
