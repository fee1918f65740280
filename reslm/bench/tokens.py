"""Benchmarks: the token level, LAERC vs the GPT baseline at matched trainable parameters.

- training tokens/s: `reslm.train.train_step` (the training loop's step, with the family's default
  optimiser, AdamW, and clipping) on random tokens;
- generation time per token at prefix lengths 64, 256 and 1024: our stateful sampler (LAERC carries
  each block's reservoir state, GPT its KV cache) against re-running the whole prefix for every new
  token (what the authors' sampler does). The cost of producing the token at length n is measured
  directly: `step()` after n tokens have been read, versus one full forward pass over n tokens.
Targets: stateful per-token time at 1024 <= 1.2 x that at 64, and >= 20x faster than
re-running the prefix at 1024. Timing goes through `reslm.bench.timing.repeat` (best repetition).
"""
from __future__ import annotations

import math

import torch

from reslm.bench.timing import repeat
from reslm.core.device import grad_scaler
from reslm.models.base import count_params
from reslm.models.gpt import GPT, GPTConfig
from reslm.models.laerc import LAERC, LAERCConfig
from reslm.train import make_optimizer, train_config, train_step
from reslm.train.batches import TokenWindows

# matched pair (trainable parameters within ~3% at V = 4096; see the "cpu" sweep in reslm.experiments.plans)
PAIR = {"laerc": dict(dim=64, n_layers=4), "gpt": dict(dim=88, n_layers=4, n_heads=4)}
TARGETS = dict(growth_long_vs_short_max=1.2, speedup_vs_rerun_at_longest_min=20.0)


def build_pair(vocab: int, context: int, device, pair=PAIR) -> dict:
    return {"laerc": LAERC(LAERCConfig(vocab_size=vocab, context=context, **pair["laerc"])).to(device),
            "gpt": GPT(GPTConfig(vocab_size=vocab, context=context, **pair["gpt"])).to(device)}


@torch.no_grad()
def generation_ms_per_token(model, lengths, device, steps: int = 16, reps: int = 5, min_time_s: float = 1.0,
                            max_reps: int = 50) -> dict:
    """{n: {"stateful_ms", "rerun_ms", "speedup"}} for each prefix length n: `steps` step() calls
    from the state after n tokens (per token) against one forward over the n-token prefix.

    All lengths are timed in one `repeat`, alternating within each repetition, so a burst of load
    from another process hits every length alike (timing the lengths one after the other made the
    long/short ratio swing with the load: 1.09 in one run, 1.31 in another); at least `reps`
    repetitions and more until `min_time_s` was spent timing, best of them each."""
    model.eval()
    V = model.config.vocab_size
    ids = torch.randint(0, V, (1, max(lengths) + steps), generator=torch.Generator().manual_seed(0)).to(device)
    fns = {}
    for n in lengths:
        state = model.init_state(1, device=device)
        for t in range(n):                                  # read the prefix (not timed)
            _, state = model.step(ids[:, t], state)

        def stateful(s=state, n=n):   # step() returns a new state (a GPT cache is rewritten in place)
            for t in range(n, n + steps):
                _, s = model.step(ids[:, t], s)

        fns[f"stateful{n}"], fns[f"rerun{n}"] = stateful, (lambda n=n: model(ids[:, :n]))
    t = repeat(fns, device, reps=reps, budget_s=math.inf, min_time_s=min_time_s, max_reps=max_reps)
    out = {}
    for n in lengths:
        st, rr = min(t[f"stateful{n}"]) / steps, min(t[f"rerun{n}"])
        out[n] = dict(stateful_ms=round(1e3 * st, 4), rerun_ms=round(1e3 * rr, 3), speedup=round(rr / st, 1),
                      reps=len(t[f"rerun{n}"]))
    return out


def training_tokens_per_s(model, *, batch: int, context: int, device, steps: int = 3, reps: int = 2) -> float:
    """Tokens/s of `reslm.train.train_step` on one random batch (best of `reps` x `steps`), with the
    optimiser make_optimizer builds from the family's training defaults (lr 1e-4)."""
    model.train()
    V = model.config.vocab_size
    tc = train_config(model.family, lr=1e-4)
    opt, scaler = make_optimizer(model, tc, device), grad_scaler("fp32", device)
    x = torch.randint(0, V, (batch, context + 1), generator=torch.Generator().manual_seed(0)).to(device)

    def train():
        for _ in range(steps):
            train_step(model.forward_features, [(x[:, :-1], x[:, 1:])], opt, scaler, lr=tc.lr, device=device,
                       grad_clip=tc.grad_clip, weights=TokenWindows.weights)

    t = repeat(dict(train=train), device, reps=reps, budget_s=math.inf)
    return batch * context * steps / min(t["train"])


def run(quick: bool, device, say=lambda msg: None, vocab: int = 4096, lengths=(64, 256, 1024),
        pair=PAIR, train_batch: int = 16, train_context: int = 128) -> dict:
    """The token-level section of `reslm bench`: {"laerc": .., "gpt": .., "targets": TARGETS}."""
    result = {}
    for name, model in build_pair(vocab, max(lengths) + 16, device, pair).items():
        trainable, fixed = count_params(model)
        tps = training_tokens_per_s(model, batch=train_batch, context=train_context, device=device,
                                    steps=1 if quick else 3)
        # the same measurement in the quick and the full bench (it costs about a second either way)
        gen = generation_ms_per_token(model, lengths, device, min_time_s=1.0 if quick else 3.0)
        lo, hi = gen[min(lengths)], gen[max(lengths)]
        result[name] = dict(config=pair[name], trainable_params=trainable, fixed_params=fixed,
                            train_tokens_per_s=round(tps, 1), train_shape=[train_batch, train_context],
                            generation=gen, growth_long_vs_short=round(hi["stateful_ms"] / lo["stateful_ms"], 3),
                            speedup_vs_rerun_at_longest=hi["speedup"])
        say(f"{name}: {trainable:,} params, {tps:,.0f} train tokens/s, per token at {max(lengths)}: "
            f"{hi['stateful_ms']} ms stateful vs {hi['rerun_ms']} ms re-running the prefix")
    result["targets"] = TARGETS
    return result
