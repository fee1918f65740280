"""skeleton"""
from __future__ import annotations
import math
from dataclasses import dataclass
import torch
from reslm.errors import ReslmError
from reslm.models.base import check_positive

@dataclass
class TransformerConfig:
    vocab_size: int = 59
    embed_dim: int = 16
    ff_dim: int = 128
    n_heads: int = 8
    n_layers: int = 8
    dropout: float = 0.1
    context: int = 32
    seed: int = 0

def sinusoidal_encoding(context: int, dim: int) -> torch.Tensor:
    pos = torch.arange(context, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    pe = torch.zeros(context, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return pe.float()
