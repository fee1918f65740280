"""Reservoirs: fixed dynamical systems that turn a sequence of input vectors into states.

Any reservoir plugs into the reservoir language models if it provides

    size                                  int, state dimension N
    input_dim                             int, input vector size d
    init_state(batch, device, dtype)      -> (B, N) initial state
    forward(u (B,T,d), s0 (B,N) | None)   -> (states (B,T,N), s_T (B,N)), no gradient
    step(u_t (B,d), s (B,N))              -> next state (B,N)

and is registered in RESERVOIRS under a name (the `reservoir` field of the model configs). A physical
substrate fits the same mould: `forward` sends the inputs to the device and returns what it measured.
"""
from reslm.reservoir.esn import ESN, ESNConfig, scale_spectral_radius, spectral_radius
from reslm.reservoir.states import CONTEXT_MODES, shard_states

RESERVOIRS = {"esn": (ESNConfig, ESN)}

__all__ = ["ESN", "ESNConfig", "RESERVOIRS", "CONTEXT_MODES", "shard_states", "spectral_radius",
           "scale_spectral_radius"]
