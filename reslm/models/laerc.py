"""Layered reservoir language model (LAERC), paper Appendix "LAERC technical specification" (sec:app_1).

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

Reservoir (fixed, buffers, never seen by the optimiser):
* W_res (R x R): dense U(-1, 1), rescaled so that its spectral radius (radius_norm="spectral") or its
  largest singular value (radius_norm="singular") equals rho_l = radius_start + (radius_end -
  radius_start) (l-1)/max(1, L-1); the paper's 0.95 + 0.04 (l-1)/max(1, L-1) is the default.
* W_in (R x D): U(-1, 1) * input_scaling / sqrt(D). The appendix gives no input distribution; the
  1/sqrt(D) keeps the pre-activation variance (x~ is layer-normed, unit scale) at input_scaling^2/3
  whatever D is, so the reservoir does not saturate for large D.
* b (R): U(-bias_scaling, bias_scaling), default bias_scaling = 0.1. The appendix has a bias b but no
  distribution; a small random bias breaks the tanh's odd symmetry. bias_scaling = 0 gives no bias.
Each matrix comes from its own generator (`esn._generator(seed, 1000 l + k)`), so the same seed
always gives the same reservoir.
Precision and kernels (Appendix A.3: "reservoir parameters are stored in low precision when
possible"): the float32 buffers are what a checkpoint holds; the recurrence runs in
`reservoir_dtype`, "auto" = float16 on CUDA (cuDNN's fused tanh RNN through `torch.rnn_tanh`, states
in [-1, 1] lose little in float16) and float32 on CPU (the `tanh_recurrence` loop; "bfloat16" on a
CPU with avx512_bf16 measured 2.2x faster at R = 1024 but 1.2x slower at R = 256, B = 16, T = 512).
The low-precision copies are cast once and cached.

Gradients. "Gradients are not propagated through the reservoir dynamics": the recurrence runs under
torch.no_grad on a detached x~, so nothing upstream of s gets a gradient from the reservoir path.
A consequence: LN_res (whose output only feeds the reservoir) never receives a gradient; its 2D
parameters per block are counted as trainable but stay at their initial values (1, 0). The readout
(LN_res_out onward) is trained normally; the block input x still gets gradients through the gate
and the (1 - g) x path.

Trainable parameters (reservoir=True, gate_layers=1, H = alpha_res R, R = r_mult D):

    V D                                    embedding (tied with the output projection)
  + T D                                    if pos_encoding == "learned"
  + L (10 D^2 + R H + H D + H + 2 R + 15 D + 2)
  + 2 D                                    final LayerNorm
  + V D                                    if tie_embeddings is False (untied head, no bias)

where per block: LN_res 2D, LN_res_out 2R, W_1/b_1 RH + H, W_2/b_2 HD + D, beta 1, LN_mix 4D,
W_g/b_g 2D^2 + D, LN_ffn 2D, FFN 8D^2 + 5D, alpha 1. gate_layers=2 adds D^2 + D per block
(2D -> D -> D). Fixed (buffers): L (R^2 + R D + R).

reservoir=False (the `--no-reservoir` ablation) removes the whole reservoir path of every block:
LN_res, W_res, W_in, b, LN_res_out, the readout MLP, beta, and also the mixing gate (with r = 0 the
gate would only rescale x); m = x, so each block is x + alpha FFN(LN_ffn(x)). What remains is the
embedding (+ positional encoding), L ReZero feed-forward blocks, the final LN and the tied head:
per block 8 D^2 + 7 D + 1 trainable parameters. There is no token mixing at all, so the prediction
at position t depends only on the token at t (and on t, through the positional encoding): a
bigram-like baseline that measures what the reservoir contributes.

Initialisation: embedding, positions and all linear weights ~ N(0, 0.02), biases 0, LayerNorms
(1, 0), beta = 0, alpha = 0; drawn on the CPU from a generator seeded by `seed` (same seed, same
weights, on any device).

Authors' variant (their released code, as described to us; differences from the appendix):
* every layer's W_res is scaled to largest singular value 0.9 (not spectral radius 0.95..0.99);
* the reservoir bias is zero;
* the gate is a two-layer MLP instead of a single linear map;
* there is no positional encoding.
`AUTHORS_VARIANT` holds these as config overrides (radius_norm="singular", radius 0.9 at both ends,
bias_scaling=0, gate_layers=2, pos_encoding="none"). The hidden width of their gate MLP is not known
here; we use D with GELU.

Generation: `init_state(batch)` gives each block's reservoir state (zeros) and a position counter;
`step(idx_t, state)` advances every block by one token (one (B,R)x(R,R) product per block), so a
token costs O(1) regardless of how many came before. Step-by-step logits equal `forward`'s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.errors import ReslmError
from reslm.models.base import check_positive, next_token_loss
from reslm.models.transformer import sinusoidal_encoding
from reslm.reservoir.esn import _generator, random_sparse, scale_spectral_radius, tanh_recurrence

POS_ENCODINGS = ("learned", "sinusoidal", "none")
RADIUS_NORMS = ("spectral", "singular")
RESERVOIR_DTYPES = ("auto", "float32", "bfloat16", "float16")

# Config overrides that turn the appendix model into the authors' released variant (see docstring).
AUTHORS_VARIANT = dict(radius_norm="singular", radius_start=0.9, radius_end=0.9, bias_scaling=0.0,
                       gate_layers=2, pos_encoding="none")


@dataclass
class LAERCConfig:
    vocab_size: int = 50257
    dim: int = 256                  # D
    n_layers: int = 6               # L
    context: int = 512              # T: longest window (rows of the learned positional table)
    r_mult: int = 4                 # R = r_mult * D
    alpha_res: float = 1.0          # readout hidden width H = alpha_res * R
    radius_start: float = 0.95      # rho_1
    radius_end: float = 0.99        # rho_L
    radius_norm: str = "spectral"   # "spectral": rho(W_res) = rho_l; "singular": sigma_max(W_res) = rho_l
    input_scaling: float = 1.0      # W_in ~ U(-1, 1) * input_scaling / sqrt(D)
    bias_scaling: float = 0.1       # b ~ U(-bias_scaling, bias_scaling)
    gate_layers: int = 1            # 1: W_g (appendix); 2: Linear(2D, D) GELU Linear(D, D) (authors)
    tie_embeddings: bool = True
    pos_encoding: str = "learned"   # "learned" | "sinusoidal" | "none"
    reservoir: bool = True          # False: --no-reservoir ablation (see docstring)
    reservoir_dtype: str = "auto"   # recurrence precision: auto (float16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16
    seed: int = 0

    @property
    def res_size(self) -> int:
        return self.r_mult * self.dim

    @property
    def res_hidden(self) -> int:
        return max(1, round(self.alpha_res * self.res_size))

    def radius(self, layer: int) -> float:
        """rho_l for layer l = 1..L (linear depth schedule)."""
        frac = (layer - 1) / max(1, self.n_layers - 1)
        return self.radius_start + (self.radius_end - self.radius_start) * frac

    def validate(self) -> "LAERCConfig":
        for name in ("vocab_size", "dim", "n_layers", "context", "r_mult", "gate_layers", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ReslmError(f"{name} must be an integer, got {v!r}")
        check_positive(vocab_size=self.vocab_size, dim=self.dim, n_layers=self.n_layers,
                       context=self.context, r_mult=self.r_mult, alpha_res=self.alpha_res,
                       radius_start=self.radius_start, radius_end=self.radius_end)
        for name in ("input_scaling", "bias_scaling"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ReslmError(f"{name} must be >= 0, got {v!r}")
        if self.pos_encoding not in POS_ENCODINGS:
            raise ReslmError(f"pos_encoding must be one of {', '.join(POS_ENCODINGS)}, got {self.pos_encoding!r}")
        if self.radius_norm not in RADIUS_NORMS:
            raise ReslmError(f"radius_norm must be one of {', '.join(RADIUS_NORMS)}, got {self.radius_norm!r}")
        if self.reservoir_dtype not in RESERVOIR_DTYPES:
            raise ReslmError(f"reservoir_dtype must be one of {', '.join(RESERVOIR_DTYPES)}, got {self.reservoir_dtype!r}")
        if self.gate_layers not in (1, 2):
            raise ReslmError(f"gate_layers must be 1 or 2, got {self.gate_layers}")
        if self.pos_encoding == "sinusoidal" and self.dim % 2:
            raise ReslmError(f"dim must be even for the sinusoidal encoding, got {self.dim}")
        for name in ("tie_embeddings", "reservoir"):
            if not isinstance(getattr(self, name), bool):
                raise ReslmError(f"{name} must be true or false, got {getattr(self, name)!r}")
        return self


def laerc_param_count(cfg: LAERCConfig) -> tuple[int, int]:
    """(trainable, fixed) from the closed form in the module docstring."""
    V, D, L, T = cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.context
    R, H = cfg.res_size, cfg.res_hidden
    trainable = V * D + 2 * D
    trainable += T * D if cfg.pos_encoding == "learned" else 0
    trainable += 0 if cfg.tie_embeddings else V * D
    if cfg.reservoir:
        block = 10 * D * D + R * H + H * D + H + 2 * R + 15 * D + 2
        block += D * D + D if cfg.gate_layers == 2 else 0
        fixed = L * (R * R + R * D + R)
    else:
        block, fixed = 8 * D * D + 7 * D + 1, 0
    return trainable + L * block, fixed


class Reservoir(nn.Module):
    """Fixed tanh RNN s_t = tanh(W_res s_{t-1} + W_in u_t + b); all weights are buffers."""

    def __init__(self, cfg: LAERCConfig, layer: int):
        super().__init__()
        R, D = cfg.res_size, cfg.dim
        self.size = R
        if torch.empty(0).is_meta:  # shape-only construction (counting parameters): draw nothing
            W, W_in, b = torch.empty(R, R), torch.empty(R, D), torch.empty(R)
        else:
            stream = 1000 * layer
            W = random_sparse(R, R, 1.0, _generator(cfg.seed, stream + 1))
            rho = cfg.radius(layer)
            if cfg.radius_norm == "spectral":
                W = scale_spectral_radius(W, rho, key=("laerc", R, cfg.seed, stream))
            else:
                W = W * (rho / torch.linalg.matrix_norm(W, ord=2).item())
            W_in = random_sparse(R, D, 1.0, _generator(cfg.seed, stream + 2)) * (cfg.input_scaling / math.sqrt(D))
            b = (torch.rand(R, generator=_generator(cfg.seed, stream + 3), dtype=torch.float64) * 2 - 1)
            b = b * cfg.bias_scaling
        # Stored transposed, so the per-step product is a row-major (B, R) @ (R, R) GEMM.
        self.register_buffer("W_T", W.T.contiguous().float())          # (R, R)
        self.register_buffer("W_in_T", W_in.T.contiguous().float())    # (D, R)
        self.register_buffer("bias", b.float())                        # (R,)
        self.dtype_name = cfg.reservoir_dtype
        self._low: dict = {}

    @property
    def W_res(self) -> torch.Tensor:
        return self.W_T.T

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The recurrence's precision on `device` (see LAERCConfig.reservoir_dtype)."""
        if self.dtype_name == "auto":
            return torch.float16 if device.type == "cuda" else torch.float32
        return getattr(torch, self.dtype_name)

    def _weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W_T, W_in_T, bias) in `dtype`; low-precision copies are made once and cached (not saved)."""
        if dtype == self.W_T.dtype:
            return self.W_T, self.W_in_T, self.bias
        key = (dtype, self.W_T.device)
        if self._low.get("key") != key:
            self._low = {"key": key, "w": tuple(t.to(dtype) for t in (self.W_T, self.W_in_T, self.bias))}
        return self._low["w"]

    @torch.no_grad()
    def forward(self, u: torch.Tensor, s0: torch.Tensor | None, backend: str | None = None) -> torch.Tensor:
        """u (B,T,D) (detached), s0 (B,R) or None (zeros) -> states (T,B,R), time-major, in the compute dtype.

        backend "loop" (the default on CPU): as `ESN.forward`, the input term W_in u + b of all steps is
        one GEMM into a (T,B,R) buffer, then the shared `tanh_recurrence` loop runs the steps in place.
        backend "rnn" (the default on CUDA): `torch.rnn_tanh`, which is cuDNN's fused RNN on a GPU; same
        equation (its second bias is zero). Autocast is off; the caller casts the states back."""
        dtype = self.compute_dtype(u.device)
        W_T, W_in_T, bias = self._weights(dtype)
        backend = backend or ("rnn" if u.is_cuda else "loop")
        with torch.autocast(u.device.type, enabled=False):
            u = u.to(dtype)
            B, T, D = u.shape
            s0 = s0.to(dtype) if s0 is not None else None
            if backend == "rnn":
                h0 = (s0 if s0 is not None else u.new_zeros(B, self.size))[None]
                params = [W_in_T.T, W_T.T, bias, torch.zeros_like(bias)]
                states, _ = torch.rnn_tanh(u.transpose(0, 1), h0, params, True, 1, 0.0, False, False, False)
                return states
            states = torch.addmm(bias, u.transpose(0, 1).reshape(T * B, D), W_in_T).view(T, B, self.size)
            tanh_recurrence(states, s0, W_T)
        return states


def _linear(d_in: int, d_out: int, bias: bool = True) -> nn.Linear:
    return nn.utils.skip_init(nn.Linear, d_in, d_out, bias=bias)


class LAERCBlock(nn.Module):
    """One block: reservoir path -> gate -> ReZero FFN (see the module docstring)."""

    def __init__(self, cfg: LAERCConfig, layer: int):
        super().__init__()
        D, R, H = cfg.dim, cfg.res_size, cfg.res_hidden
        self.has_reservoir = cfg.reservoir
        if cfg.reservoir:
            self.ln_res = nn.LayerNorm(D)
            self.reservoir = Reservoir(cfg, layer)
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
        states = self.reservoir(self.ln_res(x).detach(), s0)       # (T,B,R), no grad
        s_last = states[-1] if states.shape[0] else s0
        s = states.transpose(0, 1).to(x.dtype)                      # (B,T,R)
        r = self.res_w2(F.gelu(self.res_w1(self.ln_res_out(s)))) * self.beta.exp()
        g = torch.sigmoid(self.gate(self.ln_mix(torch.cat([x, r], dim=-1))))
        return g * r + (1 - g) * x, s_last

    def ffn(self, m: torch.Tensor) -> torch.Tensor:
        return self.ffn_w2(F.gelu(self.ffn_w1(self.ln_ffn(m))))

    def forward(self, x: torch.Tensor, s0: torch.Tensor | None = None):
        m, s = self.mix(x, s0)
        return m + self.alpha * self.ffn(m), s


class LAERC(nn.Module):
    """Layered reservoir LM. forward(idx (B,T), targets (B,T) | None) -> (logits (B,T,V), loss)."""

    family = "laerc"
    stateful = True  # generation carries each block's reservoir state: O(1) work per token

    @property
    def max_positions(self) -> int | None:
        """Steps `step` can take from an empty state: the position table's length (None without one)."""
        return None if self.config.pos_encoding == "none" else self.config.context

    @property
    def has_unused_parameters(self) -> bool:
        """LN_res never gets a gradient (see the module docstring); DDP must be told."""
        return self.config.reservoir

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
        loss = None
        if targets is not None:
            loss = next_token_loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def forward_features(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Token models train on raw windows: the features are the ids themselves."""
        return self.forward(idx, targets)

    def init_state(self, batch: int, device=None) -> dict:
        """{"states": [(B,R) zeros per block] (None entries without a reservoir), "pos": 0}."""
        device = device or self.embed.weight.device
        states = [torch.zeros(batch, b.reservoir.size, device=device) if b.has_reservoir else None
                  for b in self.blocks]
        return {"states": states, "pos": 0}

    @torch.no_grad()
    def step(self, idx_t: torch.Tensor, state: dict):
        """idx_t (B,) -> (logits (B,V), next state); one reservoir step per block."""
        logits, states = self._run(idx_t[:, None], state["states"], state["pos"])
        return logits[:, 0], {"states": states, "pos": state["pos"] + 1}
