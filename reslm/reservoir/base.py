"""The contract every registered reservoir keeps: what it can do is stated by class attributes here,
not found out by probing for methods.

    Reservoir          the module (forward, step, init_state; fixed weights as buffers)
      pure             forward(u, s0) depends on its arguments only, so windows that share a prefix
                       may share its states (reservoir/states.py); False for a device in the loop
      drivable         it can read new input, so a model on it can generate; False for a recording
      replays          its states are read, not computed: replay(tokens, offset) gives them
    ReservoirConfig    its dataclass config's class attributes
      context_modes    the context modes (reservoir/states.py) it supports
      implied(options) the reservoir-LM fields it fixes itself (a recording's size and embed_dim)

A subclass overrides only what differs from these defaults.
"""
from __future__ import annotations

import torch
from torch import nn

CONTEXT_MODES = ("window", "stream")   # how samples get their states (reservoir/states.py)


def linear_call(reservoir, u: torch.Tensor, s0: torch.Tensor | None):
    """What a linear substrate's forward (diagonal, legendre) decides first: (its dtype: float64 for a
    float64 input, else float32; whether autograd records it: only when an argument needs a gradient;
    the (states, final state) of an empty input, or None when the input has steps)."""
    dtype = torch.float64 if u.dtype == torch.float64 else torch.float32
    grad = torch.is_grad_enabled() and (u.requires_grad or (s0 is not None and s0.requires_grad))
    empty = None
    if u.shape[1] == 0:
        empty = (u.new_zeros(u.shape[0], 0, reservoir.size, dtype=dtype),
                 s0.to(dtype) if s0 is not None else reservoir.init_state(u.shape[0], u.device, dtype))
    return dtype, grad, empty



class Reservoir(nn.Module):
    """Base class of the reservoirs in RESERVOIRS (see reslm.reservoir for the methods they provide).

    `super().__init__(cfg)` validates the config and sets `config`, `size` and `input_dim` from it
    (without a config: a plain nn.Module); `step` is `forward` over one step, so a subclass that
    has nothing faster writes only `init_state` and `forward`."""

    pure = False
    drivable = True
    replays = False

    def __init__(self, cfg=None):
        super().__init__()
        if cfg is not None:
            cfg.validate()
            self.config = cfg
            self.size, self.input_dim = cfg.size, cfg.input_dim

    def step(self, u_t, s):
        """One step: u_t (B,d), s (B,N) -> next state (B,N)."""
        return self.forward(u_t[:, None], s)[1]

    def replay(self, tokens, offset):
        """The recorded states of `tokens` at `offset` of the dataset's stream (only where `replays`)."""
        raise NotImplementedError(f"{type(self).__name__} computes its states: it has nothing to replay")


class ReservoirConfig:
    """Base class of the reservoirs' dataclass configs (holds no fields: each config declares its own)."""

    context_modes: tuple[str, ...] = CONTEXT_MODES

    @staticmethod
    def implied(options: dict) -> dict:
        """{field: value} of the reservoir-LM fields this substrate fixes itself, given its options."""
        return {}
