"""The reservoir frontier's rules as code (docs/frontier.md): does a model play by the strict reservoir-family
rules, and how many trainable parameters does it spend?

The rules, each checked by `check_frontier`:

1. A fixed, untrained substrate: the model is a `ReservoirLM` (fixed random character embedding, any
   registered reservoir, recorded ones included, an optional fixed random projection of its state
   (`readout_dim`) and the readout-side measurement); none of their parameters is trainable.
2. Every trained part reads only the substrate's current state (plus the current character's fixed
   embedding or one-hot, `head_input`): all trainable parameters live in the head, and the model uses
   the shared `ReservoirLM` path from state to logits (`features`, `forward_features`, `head_features`
   not overridden), so the head sees nothing but the normalised measured state and that character.
3. No gradient flows into or through the substrate: the substrate holds no trainable parameter and
   the states are computed once, without gradients, before the head is trained (rule 2's path).
4. Trainable parameters counted as Table 1 counts them (`count_params`: every parameter with
   requires_grad, the head's weights and biases) and at most FRONTIER_BUDGET, the count of the paper's
   largest reservoir model (aerc-160-30).

A fully trained network (tf, rnn) or a token-level model fails rule 1: it is a ceiling to read the
reservoirs against, not a contestant.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from reslm.models.base import count_params
from reslm.models.reservoir_lm import HEAD_INPUTS, ReservoirLM

FRONTIER_BUDGET = 155_459          # trainable parameters of aerc-160-30 (Table 1)
_SHARED_PATH = ("features", "states", "read", "forward_features", "head_features", "measured", "normalize")


@dataclass(frozen=True)
class Frontier:
    """The verdict: `ok` when every rule holds, the trainable count, and why not (empty when ok)."""

    ok: bool
    trainable_params: int
    reasons: tuple[str, ...] = ()


def check_frontier(model: nn.Module, budget: int = FRONTIER_BUDGET) -> Frontier:
    """Check `model` (built normally or on the meta device) against the strict reservoir-family rules
    (see the module doc); returns the verdict with the Table-1 trainable count."""
    trainable, _ = count_params(model)
    reasons = []
    if not isinstance(model, ReservoirLM):
        name = getattr(model, "family", type(model).__name__)
        reasons.append(f"{name} is not a reservoir family: its trained parts read the tokens, not a fixed substrate")
    else:
        outside = [n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head.")]
        if outside:
            reasons.append(f"trainable parameters outside the readout head: {', '.join(outside[:4])}")
        fixed = [m for m in (model.reservoir, model.physical) if any(p.requires_grad for p in m.parameters())]
        if fixed:
            reasons.append("the substrate has trainable parameters (gradient would flow into it)")
        if isinstance(model.embedding, nn.Parameter) and model.embedding.requires_grad:
            reasons.append("the character embedding is trained")
        if isinstance(model.projection, nn.Parameter) and model.projection.requires_grad:
            reasons.append("the readout projection is trained")
        changed = [n for n in _SHARED_PATH if getattr(type(model), n, None) is not getattr(ReservoirLM, n, None)]
        if changed:
            reasons.append(f"the state-to-logits path is overridden ({', '.join(changed)}): the head may read "
                           "more than the current state and character")
        head_input = getattr(model.config, "head_input", "state")
        if head_input not in HEAD_INPUTS:
            reasons.append(f"head_input {head_input!r} is not one of {', '.join(HEAD_INPUTS)}")
    if trainable > budget:
        reasons.append(f"{trainable:,} trainable parameters, over the budget of {budget:,}")
    return Frontier(not reasons, trainable, tuple(reasons))


__all__ = ["FRONTIER_BUDGET", "HEAD_INPUTS", "Frontier", "check_frontier"]
