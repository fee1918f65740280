"""Closed-loop generation: each sampled token is fed back as the next input (paper).

One sampler for every model. Stateful models (reservoir models in `stream` mode, the layered reservoir
LM, the GPT baseline with its KV cache) carry their state:
the prompt is read once, then each new token costs one reservoir step and one readout. Window models
(the transformer, reservoir models in `window` mode) see the last `context` tokens each time, which is
what they were trained on.

Past the context. The token models can step only `max_positions` times from an empty state (GPT: its
learned position table and KV cache; LAERC with a positional encoding: its position table). Both were
trained on windows that start from an empty state at position 0, so when the next step would pass
that limit, the state is rebuilt by stepping through the last max_positions // 2 tokens from an empty
state: one extra step per generated token on average, and every prediction keeps at least half a
context of history. Models without a limit (`max_positions` None: stream-mode char reservoirs, LAERC
without a positional encoding) just carry on.
"""
from __future__ import annotations

import torch

from reslm.core.errors import ReslmError

# The longest sample `sample` makes: generation is one Python-level step per symbol, so a million
# symbols already take minutes to hours; a larger count (a typo, 1e20) would run for ever.
MAX_LENGTH = 1_000_000


def check_length(length: object, flag: str = "--length") -> int:
    """`length` as an int in [0, MAX_LENGTH]; ReslmError naming `flag` otherwise."""
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= MAX_LENGTH:
        raise ReslmError(f"{flag} must be an integer from 0 to {MAX_LENGTH:,}, got {length!r}")
    return length


def pick(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
          gen: torch.Generator) -> int:
    """Sample one token id from logits (V,): temperature 0 = greedy; top-k and nucleus (top-p) filtering."""
    logits = logits.float()
    if temperature == 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        drop = sorted_p.cumsum(0) - sorted_p > top_p       # keep the smallest set with mass >= top_p
        probs = probs.scatter(0, order, sorted_p.masked_fill(drop, 0))
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))


def is_stateful(model) -> bool:
    """True when the model generates by carrying a state (`init_state`/`step`), as it declares."""
    return bool(getattr(model, "stateful", False)) and hasattr(model, "step")


@torch.no_grad()
def sample(model, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None, seed: int = 0) -> list[int]:
    """Generate max_new_tokens ids (at most MAX_LENGTH) after prompt_ids (non-empty); returns only the new ids."""
    check_length(max_new_tokens, "max_new_tokens")
    was_training = model.training
    model.eval()
    device = next(iter(model.buffers()), next(model.parameters())).device
    gen = torch.Generator().manual_seed(seed)
    out: list[int] = []
    if is_stateful(model):
        limit = getattr(model, "max_positions", None)
        ids = list(prompt_ids)

        def prime(tokens):
            state = model.init_state(1, device=device)
            for t in tokens:
                logits, state = model.step(torch.tensor([t], device=device), state)
            return logits, state, len(tokens)

        logits, state, pos = prime(ids if limit is None else ids[-limit:])
        for i in range(max_new_tokens):
            nxt = pick(logits[0], temperature, top_k, top_p, gen)
            out.append(nxt)
            ids.append(nxt)
            if i + 1 == max_new_tokens:
                break
            if limit is not None and pos >= limit:
                logits, state, pos = prime(ids[-(limit // 2):])
            else:
                logits, state = model.step(torch.tensor([nxt], device=device), state)
                pos += 1
    else:
        ids = list(prompt_ids)
        context = model.config.context
        for _ in range(max_new_tokens):
            window = torch.tensor(ids[-context:], device=device)[None]
            logits, _ = model(window)                    # (1, T', V): the last row is the next token
            nxt = pick(logits[0, -1], temperature, top_k, top_p, gen)
            out.append(nxt)
            ids.append(nxt)
    model.train(was_training)
    return out
