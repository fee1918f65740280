"""reslm.generate: the one sampler (temperature / top-k / top-p semantics, seeding) and stateful
generation, for every family."""
import pytest
import torch

from reslm.generate import is_stateful, pick, sample
from reslm.models import MODELS, build_model

V = 17
TINY = {"rc": dict(size=24, context_mode="stream"), "aerc": dict(size=16, hidden=4, context_mode="stream"),
        "tf": dict(ff_dim=16, n_heads=2, n_layers=1), "rnn": dict(embed_dim=8, hidden=12),
        "laerc": dict(dim=16, n_layers=2, r_mult=2),
        "gpt": dict(dim=16, n_layers=2, n_heads=2)}


def tiny(family, **kw):
    return build_model(family, **{**TINY[family], "vocab_size": V, "context": 12, "seed": 1, **kw}).eval()


def test_pick_semantics():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9])
    g = lambda s=0: torch.Generator().manual_seed(s)
    assert pick(logits, 0, None, None, g()) == 1                        # temperature 0: greedy
    assert pick(logits, 5.0, 1, None, g()) == 1                         # top-k 1: the argmax
    assert pick(logits, 1.0, None, 1e-6, g()) == 1                      # tiny nucleus: the argmax
    draws = {pick(logits, 1.0, 2, None, g(s)) for s in range(200)}
    assert draws == {1, 3}                                              # top-k 2 keeps exactly two ids
    probs = torch.softmax(logits, 0)
    keep = {pick(logits, 1.0, None, float(probs[1] + probs[3]) - 1e-3, g(s)) for s in range(200)}
    assert keep == {1, 3}                                               # nucleus: smallest set reaching p
    assert [pick(logits, 1.0, None, None, g(7)) for _ in range(3)] == [pick(logits, 1.0, None, None, g(7))] * 3


@pytest.mark.parametrize("family", list(MODELS))
def test_same_seed_same_sample(family):
    m = tiny(family)
    a = sample(m, [1, 2, 3], 20, temperature=1.0, seed=4)
    assert a == sample(m, [1, 2, 3], 20, temperature=1.0, seed=4) and len(a) == 20
    assert all(0 <= t < V for t in a)


@pytest.mark.parametrize("family", list(MODELS))
def test_greedy_generation_equals_rerunning_the_prefix(family):
    """Stateful models carry their state (one step per token); a window model re-reads its window.
    Either way, greedy output equals greedy decoding with the full forward pass re-run over the
    prefix (stream-mode reservoirs: from the first token, as their state is)."""
    m = tiny(family)
    prompt = [3, 7, 1, 4]
    out = sample(m, prompt, 6, temperature=0)   # 4 + 6 <= context: no re-priming involved
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            if family in ("rc", "aerc"):                       # stream: the state after every token so far
                states, s = m.reservoir(m.embed(torch.tensor([ids])))
                logits = m.forward_features(m.normalize(s))[0]
            else:
                window = ids[-m.config.context:]
                logits, _ = m(torch.tensor([window]))
            ids.append(int(logits[0, -1].argmax()))
    assert out == ids[len(prompt):]
    assert is_stateful(m) == (family not in ("tf", "rnn"))   # window models re-read their window


@pytest.mark.parametrize("family", ["gpt", "laerc"])
def test_generation_past_the_context(family):
    """Past the position table the state is rebuilt from the last half context: generation goes on."""
    m = tiny(family)
    out = sample(m, [1, 2], 40, temperature=0.8, seed=3)               # context 12
    assert len(out) == 40 and out == sample(m, [1, 2], 40, temperature=0.8, seed=3)
