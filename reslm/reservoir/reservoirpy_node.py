"""Tokens -> reservoir states from a reservoirpy node: the reservoir a user built with reservoirpy
(>= 0.4.2, `pip install 'reslm[reservoirpy]'`) as a reslm substrate, stepped in torch.

reservoirpy's own updates (reservoirpy.nodes.Reservoir._step and ES2N._step in 0.4.2), x the (N,) state,
u the (d,) input read at this step:

    Reservoir   x' = (1 - lr) x + lr f(W x + Win u + bias)
    ES2N        x' = (1 - proximity) O x + proximity f(W x + Win u + bias)

lr is one leak rate or one per unit; f is one of reservoirpy's activations (tanh, sigmoid, relu,
identity, softplus, softmax) or np.tanh. `node_arrays` reads W, Win, bias, lr (or proximity and O) and f
off the node; a node that has not run yet is first initialised, as its first `run` would, on a deep copy
(with the model's input size d when the node does not know its own), so the user's node is left as it
was and every build draws the same weights. Sparse matrices (reservoirpy's default) become dense.
`ReservoirpyNode` then runs the same recurrence for a batch: forward(u (B,T,d), s0 (B,N)) -> (states
(B,T,N), s_T), in u's dtype, from a zero state unless s0 is given (reslm starts every window and shard
at rest, whatever node.state holds). A Reservoir with tanh and one leak rate goes through the ESN's
loop (esn.tanh_recurrence, with tanh as 2 sigmoid(2z) - 1 in float32 on a CPU, as the ESN's CPU default
does); the rest through a plain loop that autograd can follow.

    from reservoirpy.nodes import Reservoir
    from reslm.reservoir.reservoirpy_node import register
    register("mine", Reservoir(750, lr=0.5, sr=0.9, seed=42))              # one fixed node
    register("mine-seeded", lambda seed: Reservoir(750, lr=0.5, sr=0.9, seed=seed))   # a node per seed

`register` adds (a config class, a reservoir class) for that node to RESERVOIRS: the model's `size` and
`embed_dim` are the node's units and input size (`implied`), the model's seed goes to the function when
one is given (a fixed node ignores it: its weights are what the user drew). Nodes of other kinds, and
subclasses that change the update, are refused in one line. The ESN's knobs (spectral_radius,
input_scaling, leak_rate, ...) are not the node's (its sr, lr, ... are what the user built it with): its
config has none of them, so `reslm frontier bench --set spectral_radius=...` is refused for it in one line
(reslm.frontier.bench.bench_config) rather than giving a run of another name with the same states.
"""
from __future__ import annotations

import copy
import sys
from dataclasses import dataclass

import numpy as np
import torch

from reslm.core.errors import ReslmError
from reslm.reservoir.base import Reservoir, ReservoirConfig
from reslm.reservoir.esn import tanh_recurrence
from reslm.reservoir.registry import RESERVOIRS

MIN_VERSION = (0, 4, 2)
ACTIVATIONS = ("tanh", "sigmoid", "relu", "identity", "softplus", "softmax")
_TORCH = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "identity": lambda z: z,
          "softplus": torch.nn.functional.softplus, "softmax": lambda z: torch.softmax(z, dim=-1)}


def _reservoirpy():
    """The installed reservoirpy module (>= MIN_VERSION), or a one-line ReslmError saying how to get it."""
    try:
        import reservoirpy
        import reservoirpy.activationsfunc  # noqa: F401  (the activations the node may name)
        import reservoirpy.nodes  # noqa: F401
    except ImportError:
        raise ReslmError("a reservoirpy node needs reservoirpy: pip install 'reslm[reservoirpy]'") from None
    version = tuple(int(p) for p in reservoirpy.__version__.split(".")[:3] if p.isdigit())
    if version < MIN_VERSION:
        raise ReslmError(f"reservoirpy {reservoirpy.__version__} is older than 0.4.2, whose node API the adapter "
                         "reads: pip install 'reslm[reservoirpy]'")
    return reservoirpy


@dataclass
class NodeArrays:
    """What a reservoirpy node computes with, as float64 numpy arrays: W (N,N), Win (N,d), bias (N,), leak
    (N,) (lr, or ES2N's proximity), O (N,N) or None (ES2N's orthogonal matrix), and f's name."""
    W: np.ndarray
    Win: np.ndarray
    bias: np.ndarray
    leak: np.ndarray
    O: np.ndarray | None
    activation: str


def _dense(a, shape: tuple, what: str) -> np.ndarray:
    """A node's weight (dense, scipy.sparse or a scalar to broadcast) as a float64 array of `shape`."""
    a = a.toarray() if hasattr(a, "toarray") else np.asarray(a)
    a = np.asarray(a, dtype=np.float64)
    if a.size == 1:
        return np.full(shape, float(a.reshape(-1)[0]))
    if a.size != int(np.prod(shape)) or (len(shape) == 2 and a.shape != shape):
        raise ReslmError(f"the node's {what} has shape {a.shape}, not {shape}")
    return a.reshape(shape)


def _activation_name(f, rpy) -> str:
    """The name in ACTIVATIONS of the node's activation function f (reservoirpy's own, or np.tanh)."""
    for name in ACTIVATIONS:
        if f is getattr(rpy.activationsfunc, name):
            return name
    if f is np.tanh:
        return "tanh"
    raise ReslmError(f"the node's activation {getattr(f, '__name__', f)!r} is not one of reservoirpy's "
                     f"{', '.join(ACTIVATIONS)}: the adapter steps in torch and knows only those")


def node_arrays(node, input_dim: int | None = None) -> NodeArrays:
    """W, Win, bias, leak, O and f of a reservoirpy Reservoir or ES2N node (see the module doc); a node that
    has not run is initialised on a copy, with `input_dim` when it does not know its input size."""
    rpy = _reservoirpy()
    kinds = {rpy.nodes.Reservoir: "lr", rpy.nodes.ES2N: "proximity"}
    kind = next((k for k in kinds if isinstance(node, k)), None)
    if kind is None or type(node)._step is not kind._step:
        raise ReslmError(f"{type(node).__name__} is not a reservoirpy Reservoir or ES2N node (a node whose update "
                         "the adapter knows); build one with reservoirpy.nodes.Reservoir(...)")
    if not getattr(node, "initialized", False):
        d = node.input_dim or input_dim
        if not d:
            raise ReslmError("the reservoirpy node has not run and does not know its input size: give it input_dim")
        node = copy.deepcopy(node)
        node.initialize(np.zeros((1, d)))
    N, d = node.units, node.input_dim
    O = _dense(node.O, (N, N), "O") if kind is rpy.nodes.ES2N else None
    arrays = NodeArrays(W=_dense(node.W, (N, N), "W"), Win=_dense(node.Win, (N, d), "Win"),
                        bias=_dense(node.bias, (N,), "bias"), leak=_dense(getattr(node, kinds[kind]), (N,), kinds[kind]),
                        O=O, activation=_activation_name(node.activation, rpy))
    if not all(np.isfinite(a).all() for a in (arrays.W, arrays.Win, arrays.bias, arrays.leak)):
        raise ReslmError("the reservoirpy node's weights hold a NaN or an infinity")
    return arrays


def _is_node(obj) -> bool:
    """Whether `obj` is a reservoirpy node (nodes are callable too: a node function is told apart by this)."""
    return hasattr(obj, "_step") and hasattr(obj, "units")


@dataclass
class ReservoirpyConfig(ReservoirConfig):
    size: int = 0                   # N: the node's units (the character models take it from the node)
    input_dim: int = 16             # d: the input size (the node's when it knows it)
    seed: int = 0                   # handed to the node function; a fixed node ignores it

    source = None                   # not a field: the node, or a function seed -> node (set by `register`)
    node_name = ""                  # not a field: the name it was registered under

    @classmethod
    def node(cls, seed: int):
        """The registered node for `seed` (a fixed node is the same for every seed)."""
        return cls.source if _is_node(cls.source) else cls.source(seed)

    def validate(self):
        node = self.node(self.seed)
        if self.size != node.units:
            raise ReslmError(f"the reservoirpy node {self.node_name!r} has {node.units} units, not size {self.size} "
                             "(leave --size out or give the node's units)")
        if node.input_dim and node.input_dim != self.input_dim:
            raise ReslmError(f"the reservoirpy node {self.node_name!r} reads {node.input_dim} inputs, not "
                             f"{self.input_dim} (set --embed-dim {node.input_dim} or leave it out)")

    @classmethod
    def implied(cls, options: dict) -> dict:
        """{"size": the node's units, "embed_dim": its input size when it knows it}."""
        node = cls.node(0)
        return {"size": node.units, **({"embed_dim": node.input_dim} if node.input_dim else {})}


class ReservoirpyNode(Reservoir):
    """A reservoirpy node's recurrence in torch (see the module doc): forward(u (B,T,d), s0 (B,N)) ->
    (states (B,T,N), s_T (B,N)), in u's dtype."""

    pure = True   # forward(u, s0) depends on its arguments only

    def __init__(self, cfg: ReservoirpyConfig):
        super().__init__(cfg)
        a = node_arrays(cfg.node(cfg.seed), cfg.input_dim)
        self.activation = a.activation
        # float64 copies of the node's arrays, transposed for row-major (B, N) @ (N, N) products
        self.register_buffer("W_T", torch.from_numpy(a.W.T.copy()))         # (N, N)
        self.register_buffer("W_in_T", torch.from_numpy(a.Win.T.copy()))    # (d, N)
        self.register_buffer("bias", torch.from_numpy(a.bias))              # (N,)
        self.register_buffer("leak", torch.from_numpy(a.leak))              # (N,)
        self.register_buffer("O_T", None if a.O is None else torch.from_numpy(a.O.T.copy()))   # (N, N) or None
        # one leak rate, tanh and no O: the ESN's in-place loop computes this
        self.esn_loop = a.O is None and a.activation == "tanh" and bool((a.leak == a.leak[0]).all())
        self._cast: tuple | None = None

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch, self.size, device=device or self.W_T.device, dtype=dtype or torch.float32)

    def _weights(self, dtype: torch.dtype, device: torch.device) -> tuple:
        """(W_T, W_in_T, bias, leak, O_T) in `dtype` on `device`, cast once and cached."""
        key = (dtype, device, self.W_T.data_ptr(), self.W_T._version)
        if self._cast is None or self._cast[0] != key:
            self._cast = (key, tuple(None if t is None else t.to(device=device, dtype=dtype)
                                     for t in (self.W_T, self.W_in_T, self.bias, self.leak, self.O_T)))
        return self._cast[1]

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        """T steps for B sequences: u (B,T,d), s0 (B,N) or None (zero) -> (states (B,T,N), s_T (B,N))."""
        B, T, d = u.shape
        W_T, W_in_T, bias, leak, O_T = self._weights(u.dtype, u.device)
        s = s0.to(u.dtype) if s0 is not None else u.new_zeros(B, self.size)
        if T == 0:
            return u.new_zeros(B, 0, self.size), s
        inputs = torch.addmm(bias, u.transpose(0, 1).reshape(T * B, d), W_in_T).view(T, B, self.size)  # Win u + b
        grad = torch.is_grad_enabled() and (u.requires_grad or (s0 is not None and s0.requires_grad))
        if self.esn_loop and not grad:
            tanh_recurrence(inputs, s0 if s0 is None else s, W_T, float(self.leak[0]), via_sigmoid=True)
            return inputs.transpose(0, 1), inputs[-1]
        f, out = _TORCH[self.activation], []
        for x in inputs:                                   # x (B, N) = Win u_t + b
            kept = s if O_T is None else s @ O_T           # x or O x
            s = (1 - leak) * kept + leak * f(torch.addmm(x, s, W_T))
            out.append(s)
        return torch.stack(out, dim=1), s


def register(name: str, node, registry: dict = RESERVOIRS) -> tuple[type, type]:
    """Register a reservoirpy node (or a function seed -> node) as the substrate `name`; returns the (config
    class, reservoir class) put into `registry`. The classes are made for this node and belong to the
    caller's module (a file run by `reslm frontier bench --import`), not to reslm."""
    if not isinstance(name, str) or not name or any(c in name for c in " ,=@:/"):
        raise ReslmError(f"a substrate name must be a non-empty word without spaces or ,=@:/, got {name!r}")
    _reservoirpy()
    owner = _caller_module()
    if not _is_node(node) and not callable(node):
        raise ReslmError(f"register({name!r}, ...) takes a reservoirpy node or a function seed -> node, "
                         f"not {type(node).__name__}")
    cfg_cls = type(f"{name}Config", (ReservoirpyConfig,), {"source": node if _is_node(node) else staticmethod(node),
                                                            "node_name": name, "__module__": owner})
    node_arrays(cfg_cls.node(0), cfg_cls.node(0).input_dim or 16)   # refuse a node of another kind now
    res_cls = type(f"{name}Reservoir", (ReservoirpyNode,), {"__module__": owner})
    registry[name] = (cfg_cls, res_cls)
    return registry[name]


def _caller_module() -> str:
    """The __name__ of the module that called `register` (two frames up)."""
    return sys._getframe(2).f_globals.get("__name__", "__main__")


__all__ = ["ACTIVATIONS", "NodeArrays", "ReservoirpyConfig", "ReservoirpyNode", "node_arrays", "register"]
