"""ref skeleton"""
from __future__ import annotations
import time
import torch, torch.nn as nn
from reslm.models.transformer import TransformerConfig, sinusoidal_encoding
from reslm.models.base import next_token_loss

class ReferenceTransformer(nn.Module):
    def __init__(self, cfg=None):
        super().__init__()
        cfg = cfg or TransformerConfig()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        self.register_buffer("pe", sinusoidal_encoding(cfg.context, cfg.embed_dim), persistent=False)
        layer = nn.TransformerEncoderLayer(cfg.embed_dim, cfg.n_heads, cfg.ff_dim, cfg.dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(cfg.embed_dim, cfg.vocab_size)
    def forward(self, idx, targets=None):
        x = self.embed(idx) + self.pe[: idx.shape[1]]
        logits = self.head(self.encoder(x)[:, -1])
        return logits, next_token_loss(logits, targets)
    def load_from(self, fast):
        sd = {k.replace("layers.", "encoder.layers.", 1) if k.startswith("layers.") else k: v for k, v in fast.state_dict().items()}
        self.load_state_dict(sd)
        return self

def train_step_throughput(model, batch_size=1024, context=32, steps=10, warmup=3, vocab=59, autocast_dtype=None):
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(vocab, (batch_size, context), generator=g).to(device),
                torch.randint(vocab, (batch_size,), generator=g).to(device)) for _ in range(4)]
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()
    def step(i):
        x, y = batches[i % len(batches)]
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for i in range(warmup): step(i)
    t = time.perf_counter()
    for i in range(steps): step(i)
    return batch_size * steps / (time.perf_counter() - t)
