"""The reservoirpy adapter (reservoir/reservoirpy_node.py): a node the user built with reservoirpy, stepped in
torch, gives reservoirpy's own states; it registers as a substrate a character model trains on. Skipped
when reservoirpy is not installed (`pip install 'reslm[reservoirpy]'`)."""
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch

rpy = pytest.importorskip("reservoirpy")
from reservoirpy.nodes import ES2N, Reservoir  # noqa: E402

from reslm.core.errors import ReslmError  # noqa: E402
from reslm.models import build_model, make_config  # noqa: E402
from reslm.reservoir.reservoirpy_node import node_arrays, register  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reservoirpy_node.py"
N, D, T = 40, 5, 60


def inputs(batch=1, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, T, D))


NODES = {   # each a different part of the update: sparse / dense weights, leak per unit, bias, activations, ES2N
    "default": lambda: Reservoir(N, seed=1),
    "leaky-bias": lambda: Reservoir(N, lr=0.3, sr=0.9, bias=0.2, input_scaling=0.5, seed=2),
    "leak-per-unit-sigmoid": lambda: Reservoir(N, lr=np.linspace(0.05, 1, N), sr=1.2, activation="sigmoid", seed=3),
    "relu": lambda: Reservoir(N, lr=0.7, sr=0.5, activation="relu", seed=4),
    "softmax-identity": lambda: Reservoir(N, lr=0.5, sr=0.8, activation="softmax", seed=5),
    "given-arrays": lambda: Reservoir(W=np.random.default_rng(6).normal(size=(N, N)) / N,
                                      Win=np.random.default_rng(7).uniform(-1, 1, size=(N, D)),
                                      bias=np.random.default_rng(8).normal(size=N), lr=0.6, activation=np.tanh),
    "es2n": lambda: ES2N(N, proximity=0.2, sr=1.0, seed=9),
}


@pytest.mark.parametrize("kind", NODES)
def test_the_adapter_gives_reservoirpys_own_states(kind, registry):
    """Each node's states over a short input, against node.run: float64 to rounding, float32 to float
    tolerance; a batch of two is each sequence on its own; the state carried across two calls is one call."""
    node = NODES[kind]()
    cfg_cls, res_cls = register(f"rpy-{kind}", node)
    res = res_cls(cfg_cls(size=N, input_dim=D))
    u = inputs(batch=2)
    want = np.stack([NODES[kind]().run(u[b]) for b in range(2)])        # a fresh node per sequence
    got64, last = res(torch.from_numpy(u))
    assert got64.dtype == torch.float64 and np.abs(got64.numpy() - want).max() < 1e-12
    assert torch.equal(last, got64[:, -1])
    got32, _ = res(torch.from_numpy(u).float())
    assert got32.dtype == torch.float32 and np.abs(got32.double().numpy() - want).max() < 1e-5
    first, s = res(torch.from_numpy(u[:, :T // 2]))
    rest, _ = res(torch.from_numpy(u[:, T // 2:]), s)
    assert torch.allclose(torch.cat([first, rest], 1), got64, atol=1e-14, rtol=0)
    step = res.step(torch.from_numpy(u[:, 0]), torch.zeros(2, N, dtype=torch.float64))
    assert torch.allclose(step, got64[:, 0], atol=1e-14, rtol=0)
    assert not node.initialized or kind == "given-arrays"   # the user's node was read from a copy


def test_gradients_flow_to_the_input_through_the_recurrence(registry):
    cfg_cls, res_cls = register("rpy-grad", Reservoir(N, lr=0.4, seed=1))
    res = res_cls(cfg_cls(size=N, input_dim=D))
    u = torch.from_numpy(inputs()).requires_grad_()
    states, _ = res(u)
    states.sum().backward()
    with torch.no_grad():
        assert torch.allclose(states, res(u)[0])   # the ESN's in-place loop without grad, the same states
    assert u.grad is not None and u.grad.abs().sum() > 0


def test_a_node_function_draws_one_node_per_seed(registry):
    cfg_cls, res_cls = register("rpy-seeded", lambda seed: Reservoir(N, lr=0.5, seed=seed, input_dim=D))
    a, b, a2 = (res_cls(cfg_cls(size=N, input_dim=D, seed=s)) for s in (0, 1, 0))
    assert torch.equal(a.W_T, a2.W_T) and not torch.equal(a.W_T, b.W_T)
    assert torch.equal(a.W_T, torch.from_numpy(node_arrays(Reservoir(N, lr=0.5, seed=0, input_dim=D)).W.T.copy()))


def test_a_character_model_takes_the_nodes_size_and_input_size_and_generates(registry):
    """rc on a registered node: size and embed_dim come from the node; stepping token by token (generation)
    walks the states the stream features were computed from; window mode's forward is its features path."""
    register("rpy-model", Reservoir(N, lr=0.5, sr=0.9, seed=1, input_dim=4))
    cfg = make_config("rc", vocab_size=11, reservoir="rpy-model", context=6, context_mode="stream", streams=1)
    assert cfg.size == N and cfg.embed_dim == 4
    m = build_model("rc", cfg).eval()
    tokens = torch.randint(0, 11, (30,), generator=torch.Generator().manual_seed(0))
    feats, state = m.features(tokens), m.init_state(1)
    for t in range(29):
        logits, state = m.step(tokens[t:t + 1], state)
        if t >= 5:
            ref, _ = m.forward_features(feats.batch(torch.tensor([t - 5])))
            torch.testing.assert_close(logits, ref[:, 0], rtol=1e-4, atol=1e-4)
    m.config.context_mode = "window"
    feats, idx = m.features(tokens), torch.tensor([0, 9, 23])
    a, _ = m.forward_features(feats.batch(idx))
    b, _ = m(torch.stack([tokens[i:i + 6] for i in idx]))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ReslmError, match="size 50"):
        make_config("rc", vocab_size=11, reservoir="rpy-model", size=50)


class Mine(Reservoir):
    def _step(self, state, x):   # another update: the adapter must not pretend to know it
        return state


@pytest.mark.parametrize("node, message", [
    (Mine(N, seed=0), "not a reservoirpy Reservoir or ES2N"),
    ("a string", "takes a reservoirpy node or a function"),
    (Reservoir(N, activation=lambda z: z, seed=0), "activation '<lambda>' is not one of"),
    (Reservoir(N, seed=0, lr=np.ones(3)), "lr has shape"),
])
def test_what_the_adapter_cannot_run_is_refused_in_one_line(node, message, registry):
    with pytest.raises(ReslmError, match=message) as e:
        register("rpy-bad", node)
    assert "\n" not in str(e.value) and "rpy-bad" not in registry


def test_the_example_registers_a_node_per_seed(registry):
    runpy.run_path(str(EXAMPLE))
    cfg_cls, res_cls = registry["rpy"]
    assert cfg_cls.implied({}) == {"size": 750} and cfg_cls.node(3).units == 750
