"""tf-128-8-8 training step (forward + backward + Adam, batch 1024, context 32, dropout on) under
variants, alternated in one process, best of the repetitions:

    cur      reslm's own attention (reslm.models.transformer.SelfAttention)
    bf16     the same under torch.autocast(bfloat16)
    sdpa     F.scaled_dot_product_attention with dropout_p instead of reslm's attention
    compile  torch.compile of the model's forward (its compile time is part of the printed warm-up)

    python benchmarks/tf_attention_variants.py cur,bf16,sdpa,compile 5

The issue-11 experiment behind the README's note on SDPA and torch.compile. Prints samples/s per variant.
"""
import sys
import time

import torch
import torch.nn.functional as F

import reslm.models.transformer as T
from reslm.core.device import grad_scaler
from reslm.models import PRESETS, build_model
from reslm.train import make_optimizer, train_config, train_step

BATCH = 1024


def sdpa_forward(self, x, last_only, drop=None, pointwise=False):
    """SelfAttention.forward with torch's fused attention (its own dropout and 1/(1-p) rescaling). The
    projection lines repeat SelfAttention.forward on purpose: only the attention product is swapped."""
    B, L, d = x.shape
    h, hd = self.n_heads, d // self.n_heads
    train = self.training and self.dropout > 0
    scale = torch.ones(3 * d, 1, dtype=x.dtype, device=x.device)
    scale[:d] = hd**-0.5
    w, b = self.in_proj_weight * scale, self.in_proj_bias * scale[:, 0]
    if last_only:
        q = F.linear(x[:, -1:], w[:d], b[:d]).view(B, 1, h, hd)
        k, v = F.linear(x, w[d:], b[d:]).view(B, L, 2, h, hd).unbind(2)
    else:
        q, k, v = F.linear(x, w, b).view(B, L, 3, h, hd).unbind(2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       dropout_p=self.dropout if train else 0.0, scale=1.0)
    return o.transpose(1, 2).reshape(B, q.shape[1], d)


def make_step(kind: str):
    family, over, _ = PRESETS["tf-128-8-8"]
    model = build_model(family, **{**over, "vocab_size": 59}).train()
    opt = make_optimizer(model, train_config("tf", lr=1e-4), torch.device("cpu"))
    scaler = grad_scaler("fp32", torch.device("cpu"))
    x, y = torch.randint(59, (BATCH, 32)), torch.randint(59, (BATCH,))
    forward = torch.compile(model.forward) if kind == "compile" else model.forward

    def step():   # the training loop's own step (reslm.train.train_step)
        train_step(forward, [(x, y)], opt, scaler, lr=1e-4, precision="bf16" if kind == "bf16" else "fp32")
    return step


def main():
    kinds = sys.argv[1].split(",") if len(sys.argv) > 1 else ["cur", "bf16", "sdpa"]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    plain = T.SelfAttention.forward
    steps, best = {}, {}
    for k in kinds:
        T.SelfAttention.forward = sdpa_forward if k == "sdpa" else plain
        t0 = time.perf_counter()
        steps[k] = make_step(k)
        steps[k]()
        steps[k]()
        best[k] = float("inf")
        print(f"{k}: warm-up (2 steps, compile included) {time.perf_counter() - t0:.1f} s", flush=True)
    for _ in range(reps):
        for k in kinds:
            T.SelfAttention.forward = sdpa_forward if k == "sdpa" else plain
            t0 = time.perf_counter()
            steps[k]()
            best[k] = min(best[k], time.perf_counter() - t0)
    T.SelfAttention.forward = plain
    for k in kinds:
        print(f"{k}: {BATCH / best[k]:,.0f} samples/s (best step {best[k] * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
