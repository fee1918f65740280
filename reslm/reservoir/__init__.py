"""Stage 2, tokens -> reservoir states: fixed dynamical systems that turn input vectors into states.

Any reservoir plugs into the reservoir language models (models/reservoir_lm.py) and into LAERC's
blocks (models/laerc.py) if it provides

    size                                  int, state dimension N
    input_dim                             int, input vector size d
    init_state(batch, device, dtype)      -> (B, N) initial state
    forward(u (B,T,d), s0 (B,N) | None)   -> (states (B,T,N), s_T (B,N)); fixed weights (buffers)
    step(u_t (B,d), s (B,N))              -> next state (B,N)

and is registered in RESERVOIRS under a name (ReservoirLMConfig.reservoir, LAERCConfig.reservoir_type)
with a dataclass config that has at least `size`, `input_dim` and `seed` (and `validate()`); the
models fill whichever of the ESNConfig field names it also has (spectral_radius, radius_norm,
input_scaling, bias_scaling, dtype, ...). The weights never train; a reservoir that lets autograd
through its recurrence when u requires grad (as ESN does) also serves LAERC's reservoir_grad. A
physical substrate fits the same mould: `forward` sends the inputs to the device and returns what
it measured.
"""
from reslm.reservoir.esn import ESN, ESNConfig, tanh_recurrence
from reslm.reservoir.matrices import random_sparse, scale_radius, scale_spectral_radius, spectral_radius
from reslm.reservoir.seeding import child_seed, generator
from reslm.reservoir.states import CONTEXT_MODES, shard_states

RESERVOIRS = {"esn": (ESNConfig, ESN)}

__all__ = ["ESN", "ESNConfig", "RESERVOIRS", "CONTEXT_MODES", "shard_states", "spectral_radius",
           "scale_spectral_radius", "scale_radius", "random_sparse", "tanh_recurrence", "child_seed",
           "generator"]
