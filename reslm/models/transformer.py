"""The character-level transformer baseline (Köster & Uchida, "Reservoir Computing as a Language Model", Table 1).

The model maps a window of `context` (= 32) character ids to logits for the next character:

    x_0   = E[idx] + PE                           E: trained embedding (V, d), d = 16; PE: fixed sinusoidal encoding
    x_l   = EncoderLayer_l(x_{l-1}),  l = 1..L    non-causal self-attention over the whole window
    logit = W_out x_L[:, -1] + b_out              prediction from the LAST position only, W_out: (V, d)

Context modes (`context_mode`): "window", the paper's, as above: one target per window, so a training
step of 1,024 targets reads 1,024 windows. "causal": the same layers with a causal mask (position t
attends to positions <= t), trained on every position of a 32-character chunk at once (targets (B, T),
logits (B, T, V)), so a step of 1,024 targets reads 32 chunks: 1/32 of the window step's work. Its
score is the same as the window model's: a test character predicted from the last position of the
window of its 32 preceding characters (targets (B,) -> the last position only). The weights and the
trainable-parameter count are the same in both modes. `min_context` m > 1 scores only a chunk's
positions with at least m characters of context, its last 32 - m + 1 (the chunks then overlap by
m - 1 characters, so that an epoch still scores every character once): between the two modes, at
32 / (32 - m + 1) times the causal step's work for the same targets.

Each encoder layer is torch's `nn.TransformerEncoderLayer` with its defaults (post-LN, ReLU, dropout p):

    a   = softmax(Q K^T / sqrt(d/h))              per head, Q, K, V = x W_in^T + b_in (fused in-projection)
    x'  = LayerNorm1(x  + drop(Out(drop(a) V)))   dropout on the attention weights and on the block output
    x'' = LayerNorm2(x' + drop(W_2 drop(relu(W_1 x' + b_1)) + b_2))

Initialisation (`layer_init`): "independent" (the default) draws every layer in turn from the seed's
generator; "copies" draws the first layer and starts every other as a copy of it, as the authors' code
does (`nn.TransformerEncoder(enc_layer, num_layers)` deep-copies one layer). Only the starting point
differs: the layers train apart from there, with the same parameter count.

Trainable parameters (both modes): 944 (embedding) + 1003 (head) + L * (1168 + 33 * ff_dim), e.g. 45 083 for
(ff_dim, n_heads, n_layers) = (128, 8, 8). There is no final LayerNorm and the positional encoding is a
buffer, not a parameter; the embedding is not scaled by sqrt(d) and there is no dropout on the input.

The arithmetic is the same as torch's layer; how it is computed differs, for speed on small CPUs
(training is dominated by the (B, h, T, T) attention tensor, which is far larger than anything else
at d = 16):

* Last-layer shortcut. When only the last position feeds the head (window mode, and every scoring),
  the last layer computes queries, attention rows, the feed-forward block and both LayerNorms for that
  position only (keys and values still come from every position). Exact: in eval mode the logits equal
  the full computation (with the causal mask too: the last query sees every position).
* Dropout masks come from 16-bit random integers (four per `random_()` draw of 64 bits) instead of
  `bernoulli_`, which is several times slower on CPU; an element is dropped with probability
  round(p * 65536) / 65536 (|error| <= 7.7e-6), via one `torch.where` pass. The 1/(1-p) rescaling
  (and attention's 1/sqrt(d/h)) is folded into the (tiny) weights of the adjacent linear maps
  (W_q, W_v, out-projection, W_2) instead of costing a pass over the large activations.
* The in-projection is one fused matmul (torch's layout: rows [W_q; W_k; W_v]).

Measured on 2 CPU cores, batch 1024, fp32, train mode (forward + backward + Adam), interleaved with
the reference in one process: x2.3-3.1 at (64, 4, 4), x2.1-2.7 at (128, 8, 8), x1.8-2.0 at (256, 16, 16)
when the machine was quiet (much less when it was contended). Largest wins: dropout masks from
random_ (attention dropout was ~35% of the reference's step), where() instead of masked copies,
the folded scalings, the last-layer shortcut.

The state dict uses the same names as `nn.TransformerEncoderLayer` under `layers.<i>.`, so weights
move between this model and `reslm.bench.reference.ReferenceTransformer` with a key rename.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.core.errors import ReslmError
from reslm.models import window_kernel
from reslm.models.base import WindowFeatures, check_positive, next_token_loss


CONTEXT_MODES = ("window", "causal")
LAYER_INITS = ("independent", "copies")   # how the layers' initial parameters are drawn (layer_init)


@dataclass
class TransformerConfig:
    vocab_size: int = 59
    embed_dim: int = 16
    ff_dim: int = 128
    n_heads: int = 8
    n_layers: int = 8
    dropout: float = 0.1
    context: int = 32
    context_mode: str = "window"   # window (paper: one target per window) | causal (every position of a chunk)
    min_context: int = 1   # causal training scores only the positions with at least this many characters of context
    layer_init: str = "independent"  # independent (each layer drawn in turn from the seed's generator) | copies (every layer starts as a copy of the first, as nn.TransformerEncoder's deepcopy of one layer does: the authors' code)
    seed: int = 0  # initial weights are a function of this seed only

    @property
    def all_positions(self) -> str | None:
        """How training reads the text (reslm.train.batches): "chunks" (causal: every position of a chunk
        is a target), or None (window: one target per window)."""
        return "chunks" if self.context_mode == "causal" else None

    @property
    def chunk_targets(self) -> int:
        """Targets of one causal training chunk: its last context - min_context + 1 positions (those with
        at least min_context characters before them, the character itself included)."""
        return self.context - self.min_context + 1

    def validate(self) -> "TransformerConfig":
        check_positive(vocab_size=self.vocab_size, embed_dim=self.embed_dim, ff_dim=self.ff_dim,
                       n_heads=self.n_heads, n_layers=self.n_layers, context=self.context)
        for name in ("vocab_size", "embed_dim", "ff_dim", "n_heads", "n_layers", "context", "min_context", "seed"):
            if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool):
                raise ReslmError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.embed_dim % self.n_heads:
            raise ReslmError(f"embed_dim ({self.embed_dim}) must be divisible by n_heads ({self.n_heads})")
        if self.embed_dim % 2:
            raise ReslmError(f"embed_dim must be even for the sinusoidal encoding, got {self.embed_dim}")
        if self.context_mode not in CONTEXT_MODES:
            raise ReslmError(f"context_mode must be one of {', '.join(CONTEXT_MODES)}, got {self.context_mode!r}")
        if not 1 <= self.min_context <= self.context:
            raise ReslmError(f"min_context must be from 1 to the context ({self.context}), got {self.min_context}")
        if self.min_context > 1 and self.context_mode != "causal":
            raise ReslmError("min_context applies to causal training: add --context-mode causal")
        if self.layer_init not in LAYER_INITS:
            raise ReslmError(f"layer_init must be one of {', '.join(LAYER_INITS)}, got {self.layer_init!r}")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ReslmError(f"dropout must be in [0, 1), got {self.dropout!r}")
        return self


def training_flops_per_sample(cfg: TransformerConfig, context: int | None = None) -> float:
    """Floating-point operations of one training sample (forward + backward) of CharTransformer,
    counted analytically from the matrix products the prediction needs (elementwise work -- softmax,
    LayerNorm, dropout, Adam -- is not counted; backward = 2 x forward):

        F_layer = T (8 d^2 + 4 d f) + 4 T^2 d         a full layer: in-projection 6Td^2, scores 2T^2 d,
                                                       weighted sum 2T^2 d, out-projection 2Td^2, FF 4Tdf
        F_last  = 4 T d^2 + 4 d^2 + 4 T d + 4 d f      the last layer: keys and values of all T positions,
                                                       everything else for the last position only
        F_head  = 2 d V
        flops   = 3 (F_layer (L - 1) + F_last + F_head)

    i.e. ~6 x (weights x the positions they see) plus the attention products (12 T^2 d per full
    layer). d = embed_dim, f = ff_dim, L = n_layers, V = vocab_size, T = context (the window). This is
    the work of the model, not of an implementation: the reference (torch's encoder, every position
    through every layer) computes more for the same result."""
    T, d, f, L, V = context or cfg.context, cfg.embed_dim, cfg.ff_dim, cfg.n_layers, cfg.vocab_size
    layer = T * (8 * d * d + 4 * d * f) + 4 * T * T * d
    last = 4 * T * d * d + 4 * d * d + 4 * T * d + 4 * d * f
    return 3.0 * (layer * (L - 1) + last + 2 * d * V)


def sinusoidal_encoding(context: int, dim: int) -> torch.Tensor:
    """(context, dim) fixed encoding: PE[t, 2i] = sin(t / 10000^(2i/dim)), PE[t, 2i+1] = cos(same)."""
    pos = torch.arange(context, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    pe = torch.empty(context, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe.float()


def dropout_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """Bool tensor, True where an element is DROPPED, each with probability round(p * 65536) / 65536.

    Four independent 16-bit draws are cut from each 64-bit `random_()` value (the global torch RNG of
    `device`), which on CPU is several times cheaper than `bernoulli_`."""
    n = math.prod(shape)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-2**63, None)
    return bits.view(torch.int16)[:n].view(shape) < -32768 + round(p * 65536)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout WITHOUT the 1/(1-p) rescaling: callers fold that factor into the weights of the linear
    map that produced or consumes `x` (a (16, 16)-sized multiply instead of one over `x`)."""
    if not training or p == 0.0:
        return x
    return torch.where(dropout_mask(x.shape, p, x.device), 0.0, x)


class SelfAttention(nn.Module):
    """Multi-head self-attention with torch's parameter layout (in_proj_weight = [W_q; W_k; W_v])."""

    def __init__(self, dim: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * dim))
        self.out_proj = nn.utils.skip_init(nn.Linear, dim, dim)

    def forward(self, x: torch.Tensor, last_only: bool, drop=dropout, pointwise: bool = False,
                causal: bool = False) -> torch.Tensor:
        """x (B, T, d) -> concatenated heads (B, T, d), or (B, 1, d) for the last query only; the
        out-projection is applied by EncoderLayer (which folds the next dropout's rescaling into it).
        `causal`: query t attends to keys <= t only (the last query, which sees them all, needs no mask).

        `drop` is the dropout function (`dropout`, or `HashedDropout` of models/window_kernel.py: the fused
        kernel's masks, to check the kernel against this path; training uses `dropout`).
        `pointwise` writes the two attention products as broadcast multiply + sum over the head
        dimension instead of batched matmuls: the same numbers up to float rounding; compiled, the
        scores, softmax, dropout and the weighted sum fuse into loops over (B, T, T, h) and no
        (B, h, T, T) tensor is written for the matmuls' sake (eagerly it would be slow)."""
        B, T, d = x.shape
        h, hd = self.n_heads, d // self.n_heads
        train = self.training and self.dropout > 0
        # Fold 1/sqrt(hd) into W_q, b_q and the attention-dropout rescaling 1/(1-p) into W_v, b_v.
        scale = torch.ones(3 * d, 1, dtype=x.dtype, device=x.device)
        scale[:d] = hd**-0.5
        if train:
            scale[2 * d:] = 1.0 / (1.0 - self.dropout)
        w, b = self.in_proj_weight * scale, self.in_proj_bias * scale[:, 0]
        if last_only:
            q = F.linear(x[:, -1:], w[:d], b[:d]).view(B, 1, h, hd)
            k, v = F.linear(x, w[d:], b[d:]).view(B, T, 2, h, hd).unbind(2)
        else:
            q, k, v = F.linear(x, w, b).view(B, T, 3, h, hd).unbind(2)
        mask = None
        if causal and not last_only:   # True above the diagonal: a future position, never attended to
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        if pointwise:
            scores = (q.unsqueeze(2) * k.unsqueeze(1)).sum(-1)                    # (B, Tq, T, h)
            if mask is not None:
                scores = scores.masked_fill(mask[:, :, None], float("-inf"))
            a = drop(scores.softmax(2), self.dropout, train)
            return (a.unsqueeze(-1) * v.unsqueeze(1)).sum(2).reshape(B, q.shape[1], d)  # heads concatenated
        q = q.transpose(1, 2)                                         # (B, h, Tq, hd)
        k = k.permute(0, 2, 3, 1)                                     # (B, h, hd, T)
        v = v.transpose(1, 2)                                         # (B, h, T, hd)
        scores = torch.matmul(q, k)                                   # (B, h, Tq, T)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        a = drop(scores.softmax(-1), self.dropout, train)
        return torch.matmul(a, v).transpose(1, 2).reshape(B, q.shape[2], d)  # heads concatenated


class EncoderLayer(nn.Module):
    """Post-LN encoder layer, arithmetic of nn.TransformerEncoderLayer(d, h, ff, dropout) (ReLU)."""

    def __init__(self, dim: int, n_heads: int, ff_dim: int, dropout: float):
        super().__init__()
        self.dropout = dropout
        self.self_attn = SelfAttention(dim, n_heads, dropout)
        self.linear1 = nn.utils.skip_init(nn.Linear, dim, ff_dim)
        self.linear2 = nn.utils.skip_init(nn.Linear, ff_dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, last_only: bool = False, drop=dropout, pointwise: bool = False,
                causal: bool = False) -> torch.Tensor:
        """`drop`, `pointwise` and `causal`: see SelfAttention.forward."""
        p, train = self.dropout, self.training and self.dropout > 0
        keep = 1.0 / (1.0 - p) if train else 1.0  # inverted-dropout factor, folded into the weights
        o = self.self_attn(x, last_only, drop, pointwise, causal)
        out = self.self_attn.out_proj
        a = F.linear(o, out.weight * keep, out.bias * keep)
        x = self.norm1((x[:, -1:] if last_only else x) + drop(a, p, train))
        if drop is dropout:
            f = drop(F.relu(self.linear1(x), inplace=True), p, train)
        else:   # the same numbers; compiled, ReLU's backward then reads f (kept for linear2's gradient anyway)
            f = F.relu(drop(self.linear1(x), p, train))   # instead of a stored bool mask, which inductor writes slowly
        f = F.linear(f, self.linear2.weight * keep**2, self.linear2.bias * keep)
        return self.norm2(x + drop(f, p, train))


class CharTransformer(nn.Module):
    """Next-character transformer over a window of `context` ids (see the module docstring)."""

    family = "tf"
    cpu_eval_batch = 64   # windows per evaluation forward of the plain path on CPU (`eval_batch_cap`)
    window_step = "auto"  # TrainConfig.window_step: "auto" takes the fused kernel where it applies, "plain" never

    def __init__(self, cfg: TransformerConfig | None = None):
        super().__init__()
        cfg = (cfg or TransformerConfig()).validate()
        self.config = cfg
        self.all_positions = cfg.all_positions   # how training reads the text (reslm.train.batches)
        self.chunk_targets = cfg.chunk_targets   # and how many positions of a chunk it scores
        d = cfg.embed_dim
        self.embed = nn.utils.skip_init(nn.Embedding, cfg.vocab_size, d)
        self.register_buffer("pe", sinusoidal_encoding(cfg.context, d), persistent=False)
        self.layers = nn.ModuleList(EncoderLayer(d, cfg.n_heads, cfg.ff_dim, cfg.dropout)
                                    for _ in range(cfg.n_layers))
        self.head = nn.utils.skip_init(nn.Linear, d, cfg.vocab_size)
        if not torch.empty(0).is_meta:  # shape-only construction (counting parameters): draw nothing
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """torch's default initialisation for every part, drawn from a generator seeded by cfg.seed, in
        order: the embedding, the layers, the head. layer_init "independent" draws each layer in turn;
        "copies" draws the first and copies it into every other (nn.TransformerEncoder(layer, L) deep-copies
        the one layer it is given, so the authors' layers all start equal), then the head."""
        g = torch.Generator().manual_seed(self.config.seed)

        def linear_(lin: nn.Linear):  # nn.Linear.reset_parameters, on CPU then copied
            w = torch.empty(lin.weight.shape)
            nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=g)
            bound = 1 / math.sqrt(lin.in_features)
            lin.weight.copy_(w)
            lin.bias.copy_(torch.empty(lin.bias.shape).uniform_(-bound, bound, generator=g))

        self.embed.weight.copy_(torch.empty(self.embed.weight.shape).normal_(generator=g))
        copies = self.config.layer_init == "copies"
        for layer in self.layers[:1] if copies else self.layers:
            att = layer.self_attn
            w = torch.empty(att.in_proj_weight.shape)
            att.in_proj_weight.copy_(nn.init.xavier_uniform_(w, generator=g))
            att.in_proj_bias.zero_()
            linear_(att.out_proj)
            att.out_proj.bias.zero_()  # as nn.MultiheadAttention._reset_parameters
            linear_(layer.linear1)
            linear_(layer.linear2)
            for norm in (layer.norm1, layer.norm2):
                norm.reset_parameters()
        if copies:
            for layer in self.layers[1:]:
                layer.load_state_dict(self.layers[0].state_dict())   # copied values, no shared storage
        linear_(self.head)

    def features(self, tokens: torch.Tensor, *, position=None, dtype=None, progress: bool = False) -> WindowFeatures:
        """Windows over the stream (built per batch); position/dtype/progress are for reservoir models."""
        return WindowFeatures(tokens, self.config.context)

    def eval_batch_cap(self, precision: str) -> int:
        """Windows per evaluation forward on CPU (reslm.features.eval_batch_size; 0: no cap):
        cpu_eval_batch on the plain path, whose per-head score tensors then stay in cache; none where the
        fused window step takes the forward (fp32 windows), which a bigger batch spares per-call work."""
        fused = precision == "fp32" and self.window_step != "plain" and window_kernel.fits(self)
        return 0 if fused else self.cpu_eval_batch

    def forward_features(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = x.shape
        if T > self.config.context:
            raise ReslmError(f"window of {T} tokens is longer than the context ({self.config.context})")
        if self.window_step != "plain" and window_kernel.applies(self, x):
            return window_kernel.fused_forward(self, x, targets)
        return self._forward(x, targets, dropout, False)

    def _forward(self, x, targets, drop, pointwise: bool):
        causal = self.config.context_mode == "causal"
        every = causal and targets is not None and targets.dim() == 2   # all-position training
        h = self.embed(x) + self.pe[:x.shape[1]]
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h = layer(h, i == last and not every, drop, pointwise, causal)
        # (B, K, V) for targets (B, K): the chunk's last K positions (chunk_targets, all of them by default);
        # (B, 1, V) otherwise: the next character
        logits = self.head(h[:, -targets.shape[1]:] if every else h[:, -1:])
        return logits, next_token_loss(logits, targets)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        return self.forward_features(idx, targets)
