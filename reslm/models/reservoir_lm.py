"""What the classic reservoir (rc.py) and the attention-enhanced reservoir (aerc.py) share.

    x_t = E[c_t]                       fixed random character embedding (V x d), E ~ N(0, 1/d)
    r_t = reservoir(x_1..x_t)          fixed recurrent network (reservoir/), no gradient
    m_t = P r_t                        optional (readout_dim D > 0): D fixed random projections of the
                                       N-unit state, P ~ N(0, 1/N) (D x N), drawn from the seed: a large
                                       substrate read through D measured channels
    logits_t = head(norm(m_t))         the only trainable part (head_input: beside the state the head may
                                       also read c_t's one-hot or fixed embedding E[c_t]); `norm` is a parameter-free
                                       LayerNorm of the state (the authors' code normalises the
                                       state with a LayerNorm it never optimises; we keep the
                                       normalisation and give it no parameters, so counts match
                                       Table 1 and nothing is left untrained by accident)

Defaults: the paper gives no reservoir hyperparameters; spectral_radius 0.9 and input_scaling 2.0
are tuned for short budgets (the sweep behind them: docs/design-figures.md).

Physical constraints (reservoir/physical.py): the readout sees the measured state (the D
projections, or the N units), gain mismatch ->
additive noise -> b-bit ADC, applied before the normalisation in the precomputed features, in forward()
and in step(); the state carried through the dynamics stays exact. All off by default (then the states
are bit-identical to a model without them).

Context modes (reservoir/states.py): in `window` mode a prediction sees the state after the last
`context` characters from a zero state (the paper); in `stream` mode the state is carried through the
text, so generation is one reservoir step per character.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.core.errors import ReslmError
from reslm.models.base import TensorFeatures, next_token_loss
from reslm.reservoir import CONTEXT_MODES, KNOBS, RESERVOIRS, ReservoirKnobs, parse_options, shard_states
from reslm.reservoir.physical import FIELDS as PHYSICAL_FIELDS
from reslm.reservoir.physical import OTHER_KEY, Physical, PhysicalConfig
from reslm.reservoir.seeding import generator

HEAD_INPUTS = ("state", "state+onehot", "state+embed")   # what a head may read (models.budget: the frontier rules)


@dataclass
class ReservoirLMConfig(ReservoirKnobs):
    """The reservoir's knobs (size, spectral_radius, input_scaling, leak_rate, density, input_density,
    bias_scaling, seed: reservoir.ReservoirKnobs, declared there once) and the model's own fields. The
    seed also draws the embedding; the head's init uses seed + 1."""
    vocab_size: int = 59
    embed_dim: int = 16             # d: fixed random embedding size
    context: int = 32               # characters per sample (window length)
    context_mode: str = "stream"    # "window" (paper) or "stream" (state carried through the text)
    streams: int = 1024             # stream mode: parallel pieces of a shard
    warmup: int = 32                # stream mode: tokens read before each piece
    state_norm: bool = True         # parameter-free LayerNorm on the state before the head
    head_input: str = "state"       # what the head reads: state | state+onehot | state+embed (the current character's one-hot or fixed embedding beside the state)
    reservoir: str = "esn"          # key in reslm.reservoir.RESERVOIRS
    reservoir_options: str = ""     # the substrate's own knobs as key=value,... e.g. a_min=0.02,a_max=0.5 (see reslm.reservoir)
    # readout-side physical constraints (reservoir/physical.py); `reslm eval` can override them
    gain_mismatch: float = 0.0      # per-unit gain 1 + g N(0,1), fixed by the seed; 0 = off
    state_noise: float = 0.0        # std of Gaussian noise added to the measured state; 0 = off
    adc_bits: int = 0               # quantise the measured state to this many bits (an ADC); 0 = off
    adc_range: float = 1.0          # the ADC reads [-R, R] and clips outside (tanh states: 1)
    readout_dim: int = 0            # D: read the state through D fixed random projections (part of the substrate, drawn from the seed); 0 = read the N units

    def validate(self):
        if self.context_mode not in CONTEXT_MODES:
            raise ReslmError(f"context_mode must be one of {', '.join(CONTEXT_MODES)}, got {self.context_mode!r}")
        if self.reservoir not in RESERVOIRS:
            raise ReslmError(f"unknown reservoir {self.reservoir!r} (known: {', '.join(RESERVOIRS)})")
        modes = RESERVOIRS[self.reservoir][0].context_modes
        if self.context_mode not in modes:
            raise ReslmError(f"reservoir {self.reservoir!r} supports context mode {', '.join(modes)} only, "
                             f"not {self.context_mode!r}")
        for name in ("vocab_size", "embed_dim", "context", "streams", "size"):
            if getattr(self, name) < 1:
                raise ReslmError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.readout_dim < 0:
            raise ReslmError(f"readout_dim must be >= 0 (0: read every unit), got {self.readout_dim}")
        if self.head_input not in HEAD_INPUTS:
            raise ReslmError(f"head_input must be one of {', '.join(HEAD_INPUTS)}, got {self.head_input!r}")
        if self.warmup < 0:
            raise ReslmError(f"warmup must be >= 0, got {self.warmup}")
        self.reservoir_config().validate()
        self.physical_config()

    def physical_config(self) -> PhysicalConfig:
        """The readout-side constraints, validated."""
        return PhysicalConfig(**{k: getattr(self, k) for k in PHYSICAL_FIELDS}).validate()

    @classmethod
    def complete(cls, overrides: dict) -> dict:
        """`overrides` plus the fields the chosen substrate takes from its own files (a recording's size
        and embed_dim: `implied` in reslm.reservoir); ReslmError when they were set to something else."""
        name, text = overrides.get("reservoir", cls.reservoir), overrides.get("reservoir_options", "")
        cfg_cls = RESERVOIRS.get(name, (None,))[0] if isinstance(name, str) else None
        if cfg_cls is None or not isinstance(text, str):
            return overrides   # nothing implied (or a bad value validate() will report)
        implied = cfg_cls.implied(parse_options(name, cfg_cls, text, reserved={*cls.__dataclass_fields__, "input_dim"}))
        for key, value in implied.items():
            if overrides.get(key, value) != value:
                raise ReslmError(f"{key} {overrides[key]} (from --{key.replace('_', '-')} or the preset) is not the "
                                 f"{value} of the {name} substrate: leave it out, the substrate sets it")
        return {**overrides, **implied}

    def reservoir_config(self):
        cfg_cls, _ = RESERVOIRS[self.reservoir]
        own = {k: getattr(self, k) for k in KNOBS if k in cfg_cls.__dataclass_fields__}   # the knobs it has
        extra = parse_options(self.reservoir, cfg_cls, self.reservoir_options,
                              reserved={*self.__dataclass_fields__, "input_dim"})
        return cfg_cls(**own, **extra, input_dim=self.embed_dim)


def fixed_embedding(vocab_size: int, embed_dim: int, seed: int) -> torch.Tensor:
    """The fixed random character embedding E (V, d), E ~ N(0, 1/d) drawn from `seed` (also what
    `reslm substrate export` plays to a physical device)."""
    return torch.randn((vocab_size, embed_dim), generator=torch.Generator().manual_seed(seed)) / embed_dim ** 0.5


WINDOW_ELEMS = 2**25    # ReservoirLM.forward's time piece: at most this many state values (128 MiB in float32)
PROJECTION_KEY = 300   # seeding key of the readout projection (matrices 0-3, training 100-101, measurement 200)


def readout_projection(size: int, readout_dim: int, seed: int) -> torch.Tensor:
    """The fixed random projection P^T (N, D), P ~ N(0, 1/N): each of the D channels reads a random
    combination of the N units at the scale of one unit."""
    return torch.randn((size, readout_dim), generator=generator(seed, PROJECTION_KEY)) / size ** 0.5


class ReservoirLM(nn.Module):
    """Fixed embedding + fixed reservoir + trainable head (built by the subclass in `make_head`)."""

    family = "reservoir"

    def __init__(self, cfg: ReservoirLMConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        _, reservoir_cls = RESERVOIRS[cfg.reservoir]
        self.reservoir = reservoir_cls(cfg.reservoir_config())
        emb = torch.empty(cfg.vocab_size, cfg.embed_dim)
        if not emb.is_meta:
            emb = fixed_embedding(cfg.vocab_size, cfg.embed_dim, cfg.seed)
        self.register_buffer("embedding", emb)                                  # (V, d), fixed
        if cfg.readout_dim:
            proj = torch.empty(self.reservoir.size, cfg.readout_dim)
            if not proj.is_meta:
                proj = readout_projection(self.reservoir.size, cfg.readout_dim, cfg.seed)
            self.register_buffer("projection", proj)                            # (N, D), fixed
        else:
            self.projection = None
        self.physical = Physical(cfg.physical_config(), self.width, cfg.seed)
        torch_state = torch.random.get_rng_state()
        torch.manual_seed(cfg.seed + 1)   # head init independent of the global RNG
        try:
            self.head = self.make_head()
        finally:
            torch.random.set_rng_state(torch_state)

    def make_head(self) -> nn.Module:
        raise NotImplementedError

    # --- fixed part -------------------------------------------------------------------------
    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, self.embedding)

    def features(self, tokens: torch.Tensor, *, position: int | None = None, dtype: torch.dtype = torch.float32,
                 compute_dtype: torch.dtype | None = None, progress: bool = False,
                 noise_key: tuple[int, ...] = OTHER_KEY, offset: int = 0) -> TensorFeatures:
        """Measured, normalised reservoir states of every sample of a token stream (S,) ->
        TensorFeatures((M, N), (M,)), stored in `dtype`, computed in `compute_dtype` (default: dtype).
        `position` is where tokens[0] sits in the dataset's stream: a substrate with `replay` (a
        recording) reads its states there. noise_key / offset: sample i's measurement noise is row
        offset + i of that noise stream (reservoir/physical.py: the split, and where `tokens` starts in
        its text). With no measurement constraint, the normalisation (a function of each row alone) is
        applied to each chunk of states as it is computed, in the compute dtype, before storage: one
        pass and one rounding to `dtype` instead of a second pass over the stored states."""
        if self.config.state_norm and not self.physical.config.active and not self.reservoir.replays:
            states = self.states(tokens, dtype=dtype, compute_dtype=compute_dtype, progress=progress, normalized=True)
            return self.measured(states, tokens, normalized=True)
        states = self.states(tokens, position=position, dtype=dtype, compute_dtype=compute_dtype, progress=progress)
        return self.measured(states, tokens, noise_key=noise_key, offset=offset)

    def states(self, tokens: torch.Tensor, *, position: int | None = None, dtype: torch.dtype = torch.float32,
               compute_dtype: torch.dtype | None = None, progress: bool = False,
               normalized: bool = False) -> torch.Tensor:
        """The reservoir states of a token stream as the readout's channels see them before the measurement
        constraints (see `features`): (M, N), or (M, D) through the projection; `normalized`: each row
        through the state normalisation too, before storage (a computed reservoir only)."""
        c = self.config
        if self.reservoir.replays:   # states after tokens context-1 .. S-2, as shard_states gives
            return self.read(self.reservoir.replay(tokens, position)[c.context - 1:-1]).to(dtype)
        read = self.read if self.projection is not None else None
        if normalized:
            read = lambda s: self.normalize(self.read(s))   # noqa: E731
        return shard_states(self.reservoir, self.embed, tokens, mode=c.context_mode, context=c.context,
                            streams=c.streams, warmup=c.warmup, dtype=dtype, compute_dtype=compute_dtype,
                            progress=progress, readout=read)

    def read(self, states: torch.Tensor) -> torch.Tensor:
        """Reservoir states (..., N) -> what the readout measures (..., D): the fixed projection, or the
        states themselves when readout_dim is 0."""
        if self.projection is None:
            return states
        # one 2-D GEMM over contiguous rows: the stream path hands in a strided (B, k, N) view, and a
        # matmul on a strided bfloat16 view takes a slow CPU kernel (docs/physical-constraints.md)
        flat = states.reshape(-1, states.shape[-1])
        return (flat @ self.projection.to(states.dtype)).view(*states.shape[:-1], -1)

    @property
    def width(self) -> int:
        """The number of measured channels: readout_dim, or the reservoir's N units."""
        return self.config.readout_dim or self.reservoir.size

    def measured(self, states: torch.Tensor, tokens: torch.Tensor, *, noise_key: tuple[int, ...] = OTHER_KEY,
                 offset: int = 0, normalized: bool = False) -> TensorFeatures:
        """Raw states (M, N) of `tokens` -> measured and normalised features, in place (see `features`);
        `normalized`: states already measured (no constraint) and normalised."""
        for i0 in range(0, 0 if normalized else len(states), 65536):  # once per shard, not once per epoch
            chunk = states[i0:i0 + 65536]
            states[i0:i0 + 65536] = self.normalize(self.physical(chunk, noise_key, offset + i0))
        c = self.config
        if c.head_input == "state":
            return TensorFeatures(states, tokens[c.context:])
        # sample i's state is the one after reading tokens[context - 1 + i], its current character
        return TensorFeatures(states, tokens[c.context:], chars=tokens[c.context - 1:-1], table=self.char_table())

    def char_table(self) -> torch.Tensor | None:
        """(V, k): the row the head reads beside the state for each character (one-hot: the identity,
        embed: the fixed embedding E); None for head_input "state"."""
        kind = self.config.head_input
        if kind == "state":
            return None
        if kind == "state+onehot":
            return torch.eye(self.config.vocab_size, device=self.embedding.device)
        return self.embedding

    @property
    def head_width(self) -> int:
        """The width of what the head reads (W, W + V or W + d by head_input, W = `width`)."""
        table = {"state": 0, "state+onehot": self.config.vocab_size, "state+embed": self.config.embed_dim}
        return self.width + table[self.config.head_input]

    def head_features(self, state: torch.Tensor, chars: torch.Tensor) -> torch.Tensor:
        """A normalised state (B, N) and the current characters (B,) -> the head's input (B, D)."""
        if self.config.head_input == "state":
            return state
        return torch.cat([state, self.char_table().to(state.dtype)[chars]], dim=-1)

    def normalize(self, s: torch.Tensor) -> torch.Tensor:
        """The fixed, parameter-free state normalisation (part of the features, not of the head)."""
        return F.layer_norm(s.float(), (s.shape[-1],)).to(s.dtype) if self.config.state_norm else s

    # --- trainable part ---------------------------------------------------------------------
    def forward_features(self, states: torch.Tensor, targets: torch.Tensor | None = None):
        """Head inputs (B, D) (normalised states, with the current character when head_input says so:
        `head_features`) -> logits (B, 1, V), loss."""
        dtype = next(self.head.parameters()).dtype   # bf16-stored states meet an fp32 head
        logits = self.head(states if states.dtype == dtype else states.to(dtype))[:, None]
        return logits, next_token_loss(logits, targets)

    reads_any_window = True   # forward reads a window of any length from a zero state, as `step` does

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx (B, T): run the reservoir from a zero state over the window, predict the next token. A long
        window runs in time pieces of at most WINDOW_ELEMS state values, the state carried between them
        (the same steps)."""
        B, T = idx.shape
        piece, s = max(1, WINDOW_ELEMS // max(1, B * self.reservoir.size)), None
        for j in range(0, max(T, 1), piece):
            _, s = self.reservoir(self.embed(idx[:, j:j + piece]), s)
        s = self.normalize(self.physical.online(self.read(s), T))
        return self.forward_features(self.head_features(s, idx[:, -1]), targets)

    # --- recurrent interface (generation) ---------------------------------------------------
    @property
    def stateful(self) -> bool:
        """Generation carries the state only in stream mode (window mode restarts from zero)."""
        return self.config.context_mode == "stream"

    def init_state(self, batch: int, device=None) -> torch.Tensor:
        """A zero state; also restarts the measurement clock (reservoir/physical.py)."""
        self.physical.reset()
        return self.reservoir.init_state(batch, device=device or self.embedding.device)

    max_positions = None  # a carried state never runs out of positions

    def step(self, idx_t: torch.Tensor, state: torch.Tensor):
        """idx_t (B,) -> (logits (B, V), next state): one reservoir step and one readout of its
        measurement; the state carried on is the exact one (the constraints are readout-side)."""
        state = self.reservoir.step(self.embed(idx_t), state)
        u = self.head_features(self.normalize(self.physical.online(self.read(state))), idx_t)
        return self.forward_features(u)[0][:, 0], state

    def set_physical(self, cfg: PhysicalConfig) -> None:
        """Measure through other constraints from now on (reslm eval's overrides); the head is kept."""
        self.config = replace(self.config, **asdict(cfg))
        self.physical = Physical(self.config.physical_config(), self.width, self.config.seed)
        self.physical.to(self.embedding.device)
