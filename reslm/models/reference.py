"""The authors'-style transformer, for timing comparisons and equivalence checks only.

`ReferenceTransformer` reproduces the authors' approach in plain PyTorch: nn.Embedding + fixed
sinusoidal encoding, `nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model=16, nhead=h,
dim_feedforward=d_h, batch_first=True), L)` (post-LN, ReLU, dropout 0.1) and a Linear head on the
last position. It has exactly the parameters of `CharTransformer` (same names under `encoder.`), so
`copy_weights(fast, ref)` makes both compute the same function; the tests use that to show that the
fast model is the same architecture. Training code should use `CharTransformer`.

`train_step_throughput` times full training steps (forward + backward + Adam) of any model that
follows the `forward(idx, targets) -> (logits, loss)` contract; the benchmark runs it on both models
in the same process so that their ratio is measured on the same machine state.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn as nn

from reslm.models.base import WindowFeatures, next_token_loss
from reslm.models.transformer import CharTransformer, TransformerConfig, sinusoidal_encoding


class ReferenceTransformer(nn.Module):
    """nn.TransformerEncoder baseline (authors' approach); initialised by torch's defaults (global RNG)."""

    family = "tf-ref"

    def __init__(self, cfg: TransformerConfig | None = None):
        super().__init__()
        cfg = (cfg or TransformerConfig()).validate()
        self.config = cfg
        d = cfg.embed_dim
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.register_buffer("pe", sinusoidal_encoding(cfg.context, d), persistent=False)
        layer = nn.TransformerEncoderLayer(d_model=d, nhead=cfg.n_heads, dim_feedforward=cfg.ff_dim,
                                           dropout=cfg.dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, cfg.vocab_size)

    def features(self, tokens: torch.Tensor) -> WindowFeatures:
        return WindowFeatures(tokens, self.config.context)

    def forward_features(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        h = self.encoder(self.embed(x) + self.pe[: x.shape[1]])
        logits = self.head(h[:, -1])
        return logits, next_token_loss(logits, targets)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        return self.forward_features(idx, targets)


def copy_weights(src: nn.Module, dst: nn.Module) -> nn.Module:
    """Load `src`'s weights into `dst`, between CharTransformer (`layers.i.*`) and
    ReferenceTransformer (`encoder.layers.i.*`) in either direction; returns dst."""
    def to_ref(k):
        return "encoder." + k if k.startswith("layers.") else k

    def to_fast(k):
        return k[len("encoder."):] if k.startswith("encoder.") else k

    rename = to_ref if isinstance(dst, ReferenceTransformer) else to_fast
    dst.load_state_dict({rename(k): v for k, v in src.state_dict().items()})
    return dst


def train_step_throughput(model: nn.Module, batch_size: int = 1024, context: int = 32, steps: int = 10,
                          warmup: int = 2, vocab: int = 59, autocast_dtype: torch.dtype | None = None,
                          seed: int = 0) -> float:
    """Training samples per second: forward + backward + Adam (lr 1e-4) on random windows, train mode.

    Uses the model's device; `autocast_dtype` (e.g. torch.bfloat16) runs the forward under
    torch.autocast as a training loop would. Returns batch_size / median step time (the median
    resists a noisy shared machine better than the mean). The model's weights are updated."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    batches = [(torch.randint(vocab, (batch_size, context), generator=g).to(device),
                torch.randint(vocab, (batch_size,), generator=g).to(device)) for _ in range(4)]
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times = []
    for i in range(warmup + steps):
        x, y = batches[i % len(batches)]
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return batch_size / statistics.median(times)


__all__ = ["ReferenceTransformer", "copy_weights", "train_step_throughput", "CharTransformer"]
