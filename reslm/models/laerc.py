"""Tokens -> logits (token family): the layered reservoir LM (LAERC), paper Appendix A (sec:app_1).

A token-level causal LM: every position predicts the next token. Per block l = 1..L (input x, (B,T,D)):

    x~  = LN_res(x)                                                   (D)
    s_t = tanh(W_res s_{t-1} + W_in x~_t + b)                         (R = r_mult D)   fixed reservoir
    s~  = LN_res_out(s)                                               (R)
    r   = exp(beta) (W_2 GELU(W_1 s~ + b_1) + b_2)                    (D), hidden H = alpha_res R, beta init 0
    g   = sigmoid(W_g LN_mix([x; r]) + b_g)                           (D)
    m   = g * r + (1 - g) * x
    x'  = m + alpha FFN(LN_ffn(m)),  FFN = W_4 GELU(W_3 . + b_3) + b_4, width 4D, alpha init 0 (ReZero)

then logits = E^T LN_f(x^(L+1)) (output projection tied to the embedding E). The input is
x^(1) = E[idx] + P[t], with P learned (N(0, 0.02), `context` rows), sinusoidal (fixed buffer) or none.

Reservoir: each block's `reservoir` is built from the registry `reslm.reservoir.RESERVOIRS`
(`reservoir`, default "esn", the one reservoir engine in reservoir/esn.py: the same field, by the
same name, as the character models') with size R, input
size D and the fields below, so any registered reservoir runs inside LAERC. With the ESN (fixed
buffers, never seen by the optimiser):
* W_res (R x R): dense U(-1, 1), rescaled so that its spectral radius (radius_norm="spectral") or its
  largest singular value (radius_norm="singular") equals rho_l = spectral_radius + (spectral_radius_end -
  spectral_radius) (l-1)/max(1, L-1); the paper's 0.95 + 0.04 (l-1)/max(1, L-1) is the default.
* W_in (R x D): U(-1, 1) (input_init="uniform") or N(0, 1) ("normal"), times input_scaling / sqrt(D).
  The appendix gives no input distribution; the 1/sqrt(D) keeps the pre-activation variance (x~ is
  layer-normed, unit scale) at input_scaling^2/3 (uniform) whatever D is, so the reservoir does not
  saturate for large D.
* b (R): U(-bias_scaling, bias_scaling), default bias_scaling = 0.1. The appendix has a bias b but no
  distribution; a small random bias breaks the tanh's odd symmetry. bias_scaling = 0 gives no bias.
Seeds: block l's reservoir seed is child l-1 of the model seed (`reslm.reservoir.seeding`), and the
reservoir spawns one generator per matrix from it; the same seed always gives the same reservoirs.
Precision and kernels (Appendix A.3: "reservoir parameters are stored in low precision when
possible"): the float32 buffers are what a checkpoint holds; the recurrence runs in
`reservoir_dtype` ("auto" = float16 on CUDA, where the ESN uses cuDNN's fused tanh RNN through
`torch.rnn_tanh`, and float32 on CPU, the `tanh_recurrence` loop); states in [-1, 1] lose little in
float16. The low-precision copies are cast once and cached (speeds: docs/laerc.md).

Gradients. Appendix: "gradients are not propagated through the reservoir dynamics". With
reservoir_grad = False (default) the recurrence runs under no_grad on a detached x~, so nothing
upstream of s gets a gradient from the reservoir path. A consequence: LN_res (whose output only
feeds the reservoir) never receives a gradient; its 2D parameters per block are counted as trainable
but stay at their initial values (1, 0) (`has_unused_parameters` tells DDP). The readout
(LN_res_out onward) is trained normally; the block input x still gets gradients through the gate and
the (1 - g) x path. reservoir_grad = True (the authors' code) keeps the reservoir weights fixed but
records the recurrence with autograd, so x~, LN_res, the lower blocks and the embedding get
gradients through s.

Trainable parameters (no_reservoir=False, gate_layers=1, R = r_mult D, H = alpha_res R, or alpha_res D
with readout_hidden="dim"):

    V D                                    embedding (tied with the output projection)
  + T D                                    if pos_encoding == "learned"
  + L (10 D^2 + R H + H D + H + 2 R + 15 D + 2)
  + 2 D                                    final LayerNorm
  + V D                                    if tie_embeddings is False (untied head, no bias)

where per block: LN_res 2D, LN_res_out 2R, W_1/b_1 RH + H, W_2/b_2 HD + D, beta 1, LN_mix 4D,
W_g/b_g 2D^2 + D, LN_ffn 2D, FFN 8D^2 + 5D, alpha 1. gate_layers=2 adds D^2 + D per block
(2D -> D -> D). Fixed (ESN buffers): L (R^2 + R D + R).

no_reservoir=True (the `--no-reservoir` ablation) removes the whole reservoir path of every block:
LN_res, W_res, W_in, b, LN_res_out, the readout MLP, beta, and also the mixing gate (with r = 0 the
gate would only rescale x); m = x, so each block is x + alpha FFN(LN_ffn(x)). What remains is the
embedding (+ positional encoding), L ReZero feed-forward blocks, the final LN and the tied head:
per block 8 D^2 + 7 D + 1 trainable parameters. There is no token mixing at all, so the prediction
at position t depends only on the token at t (and on t, through the positional encoding): a
bigram-like baseline that measures what the reservoir contributes.

Initialisation: embedding, positions and all linear weights ~ N(0, 0.02), biases 0, LayerNorms
(1, 0), beta = 0, alpha = 0; drawn on the CPU from a generator seeded by `seed` (same seed, same
weights, on any device). Optimiser groups: `param_groups(weight_decay)` (decay on linear weight
matrices only; the embedding group carries lr_mult = embed_lr_mult).

Authors' variant: where the authors' released code differs from the appendix text (and from reslm's
defaults, which follow the text). `AUTHORS_VARIANT` holds the model overrides, reslm.settings'
`AUTHORS_TRAIN` the training-side values:
* readout MLP hidden width H = D, not alpha_res R = 4D (readout_hidden="dim");
* gradients flow through the (fixed) reservoir recurrence into LN_res, the lower blocks and the
  embedding, not stopped at the reservoir (reservoir_grad=True);
* the gate is a two-layer MLP Linear(2D, D) GELU Linear(D, D), not a single W_g (gate_layers=2);
* W_in ~ N(0, 1) / sqrt(D) (input_init="normal", input_scaling=1); the text gives no distribution;
* the reservoir bias is zero (bias_scaling=0); the text has a bias b;
* every layer's W_res has largest singular value 0.9 (radius_norm="singular", radius 0.9 at both
  ends), not spectral radius 0.95..0.99;
* no positional encoding (pos_encoding="none"); the text's x^(1) = E e(x_t) has none either, and
  reslm's default adds a learned table (the reservoir alone carries order);
* embedding learning rate x0.2 (embed_lr_mult=0.2), lr 4e-4, a hold of 10% and a warm-up of 1% of
  the steps (reslm.settings.AUTHORS_TRAIN); the text gives neither.
The rest agrees: R = 4D, LN_res present (2D per block), tied embeddings, final LN, ReZero FFN of
width 4D, so the trainable count is the authors' model's (checked: docs/design-figures.md). The
closed form above with R = 4D, H = D and the two-layer gate: V D + 2 D + L (16 D^2 + 25 D + 2).

Generation: `init_state(batch)` gives each block's reservoir state (zeros) and a position counter;
`step(idx_t, state)` advances every block by one token (one (B,R)x(R,R) product per block), so a
token costs O(1) regardless of how many came before. Step-by-step logits equal `forward`'s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.core.errors import ReslmError
from reslm.models.base import TokenLM, check_positive, next_token_loss
from reslm.models.transformer import sinusoidal_encoding
from reslm.reservoir import RESERVOIRS
from reslm.reservoir.seeding import child_seed

POS_ENCODINGS = ("learned", "sinusoidal", "none")
RADIUS_NORMS = ("spectral", "singular")
RESERVOIR_DTYPES = ("auto", "float32", "bfloat16", "float16")
INPUT_INITS = ("uniform", "normal")
READOUT_HIDDEN = ("res", "dim")
RENAMED = {"radius_start": "spectral_radius", "radius_end": "spectral_radius_end"}   # old field -> today's

# Config overrides that turn the appendix model into the authors' released variant (see docstring).
AUTHORS_VARIANT = dict(r_mult=4, readout_hidden="dim", alpha_res=1.0, reservoir_grad=True, gate_layers=2,
                       input_init="normal", input_scaling=1.0, bias_scaling=0.0, radius_norm="singular",
                       spectral_radius=0.9, spectral_radius_end=0.9, pos_encoding="none", embed_lr_mult=0.2)


@dataclass
class LAERCConfig:
    vocab_size: int = 50257
    dim: int = 256                  # D
    n_layers: int = 6               # L
    context: int = 512              # T: longest window (rows of the learned positional table)
    r_mult: int = 4                 # R = r_mult * D
    alpha_res: float = 1.0          # readout hidden width H = alpha_res * R (or * D, see readout_hidden)
    readout_hidden: str = "res"     # H = alpha_res * R ("res", appendix) or alpha_res * D ("dim", authors' code)
    spectral_radius: float = 0.95   # rho_1, the first block's radius (the ESN's field, by its name)
    spectral_radius_end: float = 0.99  # rho_L, the last block's
    radius_norm: str = "spectral"   # "spectral": rho(W_res) = rho_l; "singular": sigma_max(W_res) = rho_l
    input_scaling: float = 1.0      # W_in ~ U(-1, 1) (or N(0, 1)) * input_scaling / sqrt(D)
    input_init: str = "uniform"     # W_in entries: "uniform" U(-1, 1) or "normal" N(0, 1) (authors' code)
    bias_scaling: float = 0.1       # b ~ U(-bias_scaling, bias_scaling)
    gate_layers: int = 1            # 1: W_g (appendix); 2: Linear(2D, D) GELU Linear(D, D) (authors)
    tie_embeddings: bool = True
    pos_encoding: str = "learned"   # "learned" | "sinusoidal" | "none"
    reservoir: str = "esn"          # key in reslm.reservoir.RESERVOIRS: the reservoir of every block
    no_reservoir: bool = False      # the ablation: no reservoir path in any block, a feed-forward baseline
    reservoir_dtype: str = "auto"   # recurrence precision: auto (float16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16
    reservoir_grad: bool = False    # True: gradients flow through the fixed reservoir into x~ (authors' code)
    embed_lr_mult: float = 1.0      # embedding learning rate = lr * embed_lr_mult (0.2 in the authors' code)
    seed: int = 0

    @property
    def res_size(self) -> int:
        return self.r_mult * self.dim

    @property
    def res_hidden(self) -> int:
        base = self.res_size if self.readout_hidden == "res" else self.dim
        return max(1, round(self.alpha_res * base))

    def radius(self, layer: int) -> float:
        """rho_l for layer l = 1..L (linear depth schedule)."""
        frac = (layer - 1) / max(1, self.n_layers - 1)
        return self.spectral_radius + (self.spectral_radius_end - self.spectral_radius) * frac

    def reservoir_config(self, layer: int):
        """The config of layer l's reservoir (l = 1..L): RESERVOIRS[reservoir]'s config class with
        whichever of these fields it has (size, input_dim and seed at least)."""
        cfg_cls, _ = RESERVOIRS[self.reservoir]
        want = dict(size=self.res_size, input_dim=self.dim, seed=child_seed(self.seed, layer - 1),
                    spectral_radius=self.radius(layer), radius_norm=self.radius_norm,
                    input_scaling=self.input_scaling, input_init=self.input_init, input_scale_by_dim=True,
                    bias_scaling=self.bias_scaling, dtype=self.reservoir_dtype)
        have = {f.name for f in fields(cfg_cls)}
        missing = {"size", "input_dim", "seed"} - have
        if missing:
            raise ReslmError(f"reservoir {self.reservoir!r} has no config field {', '.join(sorted(missing))}")
        return cfg_cls(**{k: v for k, v in want.items() if k in have})

    @classmethod
    def complete(cls, overrides: dict) -> dict:
        """`overrides` with the fields of run configs written before a rename, under their current
        names: `reservoir` was the ablation switch (a bool: False = no reservoir) and `reservoir_type`
        the registry name, now `no_reservoir` and `reservoir` (the character models' name);
        `radius_start` and `radius_end` are now `spectral_radius` (the ESN's name) and
        `spectral_radius_end`. Old run folders load and compare as the same model."""
        out = dict(overrides)
        for old, new in RENAMED.items():
            if old in out:
                value = out.pop(old)
                out.setdefault(new, value)
        if isinstance(out.get("reservoir"), bool):
            out["no_reservoir"] = not out.pop("reservoir")
        if "reservoir_type" in out:
            kind = out.pop("reservoir_type")
            out.setdefault("reservoir", kind)
        return out

    def validate(self) -> "LAERCConfig":
        for name in ("vocab_size", "dim", "n_layers", "context", "r_mult", "gate_layers", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ReslmError(f"{name} must be an integer, got {v!r}")
        check_positive(vocab_size=self.vocab_size, dim=self.dim, n_layers=self.n_layers,
                       context=self.context, r_mult=self.r_mult, alpha_res=self.alpha_res,
                       spectral_radius=self.spectral_radius, spectral_radius_end=self.spectral_radius_end,
                       embed_lr_mult=self.embed_lr_mult)
        if self.seed < 0:
            raise ReslmError(f"seed must be >= 0, got {self.seed}")
        for name in ("input_scaling", "bias_scaling"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ReslmError(f"{name} must be >= 0, got {v!r}")
        for name, allowed in (("pos_encoding", POS_ENCODINGS), ("radius_norm", RADIUS_NORMS),
                              ("reservoir_dtype", RESERVOIR_DTYPES), ("input_init", INPUT_INITS),
                              ("readout_hidden", READOUT_HIDDEN), ("reservoir", RESERVOIRS)):
            if getattr(self, name) not in allowed:
                raise ReslmError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.gate_layers not in (1, 2):
            raise ReslmError(f"gate_layers must be 1 or 2, got {self.gate_layers}")
        if self.pos_encoding == "sinusoidal" and self.dim % 2:
            raise ReslmError(f"dim must be even for the sinusoidal encoding, got {self.dim}")
        for name in ("tie_embeddings", "no_reservoir", "reservoir_grad"):
            if not isinstance(getattr(self, name), bool):
                raise ReslmError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not self.no_reservoir:
            self.reservoir_config(1).validate()
        return self


def laerc_param_count(cfg: LAERCConfig) -> tuple[int, int]:
    """(trainable, fixed) from the closed form in the module docstring (fixed: the ESN's buffers)."""
    V, D, L, T = cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.context
    R, H = cfg.res_size, cfg.res_hidden
    trainable = V * D + 2 * D
    trainable += T * D if cfg.pos_encoding == "learned" else 0
    trainable += 0 if cfg.tie_embeddings else V * D
    if not cfg.no_reservoir:
        block = 10 * D * D + R * H + H * D + H + 2 * R + 15 * D + 2
        block += D * D + D if cfg.gate_layers == 2 else 0
        fixed = L * (R * R + R * D + R)
    else:
        block, fixed = 8 * D * D + 7 * D + 1, 0
    return trainable + L * block, fixed


def _linear(d_in: int, d_out: int, bias: bool = True) -> nn.Linear:
    return nn.utils.skip_init(nn.Linear, d_in, d_out, bias=bias)


class LAERCBlock(nn.Module):
    """One block: reservoir path -> gate -> ReZero FFN (see the module docstring)."""

    def __init__(self, cfg: LAERCConfig, layer: int):
        super().__init__()
        D, R, H = cfg.dim, cfg.res_size, cfg.res_hidden
        self.has_reservoir, self.reservoir_grad = not cfg.no_reservoir, cfg.reservoir_grad
        if self.has_reservoir:
            _, reservoir_cls = RESERVOIRS[cfg.reservoir]
            self.ln_res = nn.LayerNorm(D)
            self.reservoir = reservoir_cls(cfg.reservoir_config(layer))   # fixed; evaluation times it by name
            self.ln_res_out = nn.LayerNorm(R)
            self.res_w1 = _linear(R, H)
            self.res_w2 = _linear(H, D)
            self.beta = nn.Parameter(torch.zeros(()))
            self.ln_mix = nn.LayerNorm(2 * D)
            if cfg.gate_layers == 1:
                self.gate = _linear(2 * D, D)
            else:
                self.gate = nn.Sequential(_linear(2 * D, D), nn.GELU(), _linear(D, D))
        self.ln_ffn = nn.LayerNorm(D)
        self.ffn_w1 = _linear(D, 4 * D)
        self.ffn_w2 = _linear(4 * D, D)
        self.alpha = nn.Parameter(torch.zeros(()))

    def mix(self, x: torch.Tensor, s0: torch.Tensor | None = None):
        """x (B,T,D), s0 (B,R) or None -> (m (B,T,D), s_T (B,R) or None). m = x without a reservoir."""
        if not self.has_reservoir:
            return x, None
        u = self.ln_res(x)
        if not self.reservoir_grad:
            u = u.detach()                                          # the reservoir runs without autograd
        states, s_last = self.reservoir(u, s0)                      # (B,T,R), (B,R) in the compute dtype
        s = states.to(x.dtype)
        r = self.res_w2(F.gelu(self.res_w1(self.ln_res_out(s)))) * self.beta.exp()
        g = torch.sigmoid(self.gate(self.ln_mix(torch.cat([x, r], dim=-1))))
        return g * r + (1 - g) * x, s_last

    def ffn(self, m: torch.Tensor) -> torch.Tensor:
        return self.ffn_w2(F.gelu(self.ffn_w1(self.ln_ffn(m))))

    def forward(self, x: torch.Tensor, s0: torch.Tensor | None = None):
        m, s = self.mix(x, s0)
        return m + self.alpha * self.ffn(m), s


class LAERC(TokenLM):
    """Layered reservoir LM. forward(idx (B,T), targets (B,T) | None) -> (logits (B,T,V), loss)."""

    family = "laerc"
    stateful = True  # generation carries each block's reservoir state: O(1) work per token

    @property
    def max_positions(self) -> int | None:
        """Steps `step` can take from an empty state: the position table's length (None without one)."""
        return None if self.config.pos_encoding == "none" else self.config.context

    @property
    def has_unused_parameters(self) -> bool:
        """Without reservoir_grad LN_res never gets a gradient (see the module docstring); DDP must be told."""
        return not self.config.no_reservoir and not self.config.reservoir_grad

    def __init__(self, cfg: LAERCConfig | None = None):
        super().__init__()
        cfg = (cfg or LAERCConfig()).validate()
        self.config = cfg
        D = cfg.dim
        self.embed = nn.utils.skip_init(nn.Embedding, cfg.vocab_size, D)
        if cfg.pos_encoding == "learned":
            self.pos = nn.Parameter(torch.empty(cfg.context, D))
        elif cfg.pos_encoding == "sinusoidal":
            self.register_buffer("pos", sinusoidal_encoding(cfg.context, D), persistent=False)
        else:
            self.pos = None
        self.blocks = nn.ModuleList(LAERCBlock(cfg, l) for l in range(1, cfg.n_layers + 1))
        self.ln_f = nn.LayerNorm(D)
        self.head = None if cfg.tie_embeddings else _linear(D, cfg.vocab_size, bias=False)
        if not torch.empty(0).is_meta:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """N(0, 0.02) weights (embedding, positions, linears), zero biases, LN (1, 0), beta = alpha = 0;
        drawn on the CPU from a generator seeded by cfg.seed. Reservoir buffers are not touched."""
        g = torch.Generator().manual_seed(self.config.seed)

        def normal_(p: torch.Tensor):
            p.copy_(torch.empty(p.shape).normal_(0.0, 0.02, generator=g))

        normal_(self.embed.weight)
        if isinstance(self.pos, nn.Parameter):
            normal_(self.pos)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                normal_(m.weight)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.LayerNorm):
                m.reset_parameters()
        for b in self.blocks:
            b.alpha.zero_()
            if b.has_reservoir:
                b.beta.zero_()

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW parameter groups: weight decay on nn.Linear weight matrices only; none on biases,
        LayerNorms, positions and scalars; the embedding (also the tied output projection) in a group
        of its own, without decay, carrying lr_mult = embed_lr_mult (the training loop sets each
        group's lr to lr * lr_mult). Empty groups are left out."""
        linear = {id(m.weight) for m in self.modules() if isinstance(m, nn.Linear)}
        embed = self.embed.weight
        decay, no_decay = [], []
        for p in self.parameters():            # each shared tensor once
            if p.requires_grad and p is not embed:
                (decay if id(p) in linear else no_decay).append(p)
        groups = [dict(params=decay, weight_decay=weight_decay, lr_mult=1.0),
                  dict(params=no_decay, weight_decay=0.0, lr_mult=1.0),
                  dict(params=[embed] if embed.requires_grad else [], weight_decay=0.0,
                       lr_mult=self.config.embed_lr_mult)]
        return [g for g in groups if g["params"]]

    def _positions(self, start: int, T: int) -> torch.Tensor | None:
        if self.pos is None:
            return None
        if start + T > self.config.context:
            raise ReslmError(f"position {start + T - 1} is past the context ({self.config.context}) "
                             f"of the {self.config.pos_encoding} positional encoding")
        return self.pos[start:start + T]

    def _run(self, idx: torch.Tensor, states: list | None, start: int):
        """idx (B,T) from position `start`, reservoir states (one per block, or None = zeros)
        -> (logits (B,T,V), new states)."""
        x = self.embed(idx)
        p = self._positions(start, idx.shape[1])
        if p is not None:
            x = x + p
        new_states = []
        for i, block in enumerate(self.blocks):
            x, s = block(x, None if states is None else states[i])
            new_states.append(s)
        z = self.ln_f(x)
        logits = F.linear(z, self.embed.weight) if self.head is None else self.head(z)
        return logits, new_states

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits, _ = self._run(idx, None, 0)
        return logits, next_token_loss(logits, targets)

    def init_state(self, batch: int, device=None) -> dict:
        """{"states": [(B,R) zeros per block] (None entries without a reservoir), "pos": 0}."""
        device = device or self.embed.weight.device
        states = [b.reservoir.init_state(batch, device=device) if b.has_reservoir else None for b in self.blocks]
        return {"states": states, "pos": 0}

    @torch.no_grad()
    def step(self, idx_t: torch.Tensor, state: dict):
        """idx_t (B,) -> (logits (B,V), next state); one reservoir step per block."""
        logits, states = self._run(idx_t[:, None], state["states"], state["pos"])
        return logits[:, 0], {"states": states, "pos": state["pos"] + 1}
