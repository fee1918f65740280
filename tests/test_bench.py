"""The benchmark's building blocks at tiny sizes: keys present, figures positive and finite, the
amortised formula, and the re-implementations of the authors' approach compute the same numbers as
the models. No speed is asserted anywhere."""
import json
import math
import time

import pytest
import torch

from reslm import bench
from reslm.bench import (BenchPlan, amortised_samples_per_s, authors_logits, authors_window_states,
                         run_bench, timing_model, timing_reservoir)
from reslm.models import build_model
from reslm.reservoir import ESNConfig

CPU = torch.device("cpu")

TINY = BenchPlan(batch=16, recurrence_sizes=(32,), recurrence_work=1e5, recurrence_steps=(2, 2),
                 states_sizes=(32,), stream_work=1e5, stream_steps=(3, 3), stream_warmup=2,
                 window_work=1e5, window_samples=(8, 24),
                 models=(("rc-32", "rc", dict(size=32)), ("aerc-24-4", "aerc", dict(size=24, hidden=4)),
                         ("tf-16-2-1", "tf", dict(ff_dim=16, n_heads=2, n_layers=1))),
                 head_steps=2, authors_steps=1, tf_steps=1, tf_warmup=1, reps=2, max_reps=2, budget_s=5.0,
                 token_level=False)


def _numbers(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _numbers(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield x


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny ops: one thread is faster, and immune to other processes holding the other cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def report():
    return run_bench(plan=TINY, device="cpu")


def test_report_has_the_keys_and_is_json(report):
    for key in ("reservoir_gflops", "gemm_gflops", "reservoir_vs_gemm", "reservoir_gflops_bf16",
                "gemm_gflops_bf16", "reservoir_vs_gemm_bf16", "reservoir_chars_per_s", "training",
                "training_samples_per_s", "authors_samples_per_s", "speedup_vs_authors", "authors_quoted",
                "targets", "method", "device", "dtype", "torch", "threads", "batch_size", "seconds",
                "load_average", "contention", "meets_target", "reservoir_chars_per_s_bf16"):
        assert key in report, key
    json.loads(json.dumps(report))
    assert set(report["reservoir_gflops"]) == {"32"} and set(report["gemm_gflops_bf16"]) == {"32"}
    assert set(report["reservoir_chars_per_s"]) == {"32", "24"}
    assert set(report["reservoir_chars_per_s"]["32"]) == {"stream", "window"}
    assert set(report["reservoir_chars_per_s_bf16"]["32"]) == {"stream", "window"}
    assert set(report["speedup_vs_authors"]) == {"rc-32", "aerc-24-4", "tf-16-2-1"}
    for label in ("rc-32", "aerc-24-4"):
        assert set(report["speedup_vs_authors"][label]) == {"window", "stream"}
        for mode in ("window", "stream"):
            assert {"head_samples_per_s", "reservoir_samples_per_s", "amortised_samples_per_s",
                    "speedup_vs_authors"} <= set(report["training"][label][mode])
    assert report["authors_quoted"]["rc-750"] == 4100 and report["authors_quoted"]["tf-128-8-8"] == 737
    assert report["batch_size"] == 16 and report["device"] == "cpu"


def test_all_figures_positive_and_finite(report):
    figures = [*_numbers(report["recurrence"]), *_numbers(report["reservoir_states"]),
               *_numbers(report["reservoir_states_bf16"]),
               *_numbers(report["training"]), *_numbers(report["speedup_vs_authors"])]
    assert figures
    for x in figures:
        assert math.isfinite(x) and x > 0


def test_amortised_figures_follow_the_formula(report):
    for label in ("rc-32", "aerc-24-4"):
        t = report["training"][label]
        for mode in ("window", "stream"):
            m = t[mode]
            assert m["reservoir_samples_per_s"] == report["reservoir_chars_per_s"][str(t["size"])][mode]
            expect = amortised_samples_per_s(m["reservoir_samples_per_s"], m["head_samples_per_s"], 5)
            assert m["amortised_samples_per_s"] == pytest.approx(expect, rel=1e-3)
            assert m["speedup_vs_authors"] == pytest.approx(m["amortised_samples_per_s"] / t["authors_samples_per_s"],
                                                            rel=2e-3)


def test_amortised_formula_on_made_up_numbers():
    # reservoir 1000 samples/s -> 1 ms per sample, /5 = 0.2 ms; head 5000 samples/s -> 0.2 ms: 0.4 ms in all
    assert amortised_samples_per_s(1000.0, 5000.0, 5) == pytest.approx(2500.0)
    assert amortised_samples_per_s(1000.0, 5000.0, 1) == pytest.approx(1 / (1e-3 + 2e-4))
    # an infinitely fast reservoir leaves the head; many epochs make the reservoir free
    assert amortised_samples_per_s(1e30, 5000.0) == pytest.approx(5000.0)
    assert amortised_samples_per_s(1000.0, 5000.0, 10**9) == pytest.approx(5000.0)


def test_repeat_alternates_and_respects_reps_and_budget():
    calls = []
    t = bench.repeat(dict(a=lambda: calls.append("a"), b=lambda: calls.append("b")), CPU, reps=3, budget_s=60)
    assert calls == ["a", "b"] + ["a", "b"] * 3 and len(t["a"]) == len(t["b"]) == 3
    t = bench.repeat(dict(a=lambda: None), CPU, reps=5, budget_s=0.0)
    assert len(t["a"]) == 1  # over budget after the first repetition
    t = bench.repeat(dict(a=lambda: None), CPU, reps=2, budget_s=60, min_time_s=60, max_reps=7)
    assert len(t["a"]) == 7  # cheap: more repetitions, up to max_reps, while under min_time_s
    t = bench.repeat(dict(a=lambda: time.sleep(0.01)), CPU, reps=2, budget_s=60, min_time_s=0.0, max_reps=7)
    assert len(t["a"]) == 2 and all(x >= 0.01 for x in t["a"])


def test_contention_probe_restores_threads():
    torch.set_num_threads(2)
    try:
        p = bench.contention_probe(elems=1024, ops=2)
        assert torch.get_num_threads() == 2 and p["threads"] == 2
    finally:
        torch.set_num_threads(1)
    assert p["multi_ms_per_op"] > 0 and p["single_ms_per_op"] > 0 and isinstance(p["contended"], bool)


def test_plan_sizes():
    full = BenchPlan.full()
    assert {750, 2600} <= set(full.recurrence_sizes) and {750, 2600} <= set(full.states_sizes)
    for N in (100, 750, 2600):
        n = bench.stream_samples(N, full)
        L = (n + full.context - 1) / full.batch
        assert L == int(L) and full.stream_steps[0] <= L <= full.stream_steps[1]
        assert 1 <= bench.window_samples(N, full) <= 2**26 // (full.context * N)
    assert {"rc-750", "aerc-100-20", "tf-128-8-8"} <= set(BenchPlan.quick().models)


def test_timing_reservoir_shape_and_scale():
    cfg = ESNConfig(size=200, seed=3)
    esn = timing_reservoir(cfg, CPU)
    assert esn.W_T.shape == (200, 200) and esn.W_in_T.shape == (16, 200) and not esn.W_T.is_meta
    rho = torch.linalg.eigvals(esn.W_T.double()).abs().max().item()
    assert 0.75 < rho < 1.05  # circular-law estimate of 0.9
    states, last = esn(torch.randn(4, 10, 16))
    assert torch.isfinite(states).all() and last.abs().max() <= 1


@pytest.mark.parametrize("family,overrides", [("rc", dict(size=40)), ("aerc", dict(size=30, hidden=5))])
def test_authors_reimplementation_matches_the_model(family, overrides):
    model = timing_model(family, overrides, CPU)
    ref = build_model(family, **overrides)
    for (name, a), (_, b) in zip(model.head.named_parameters(), ref.head.named_parameters()):
        torch.testing.assert_close(a, b, msg=name)  # the head is drawn as the constructor draws it
    torch.testing.assert_close(model.embedding, ref.embedding)
    windows = torch.randint(59, (6, 32))
    s = authors_window_states(model, windows)
    torch.testing.assert_close(s, model.reservoir(model.embed(windows))[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(authors_logits(model, s), model.forward_features(model.normalize(s))[0],
                               rtol=1e-4, atol=1e-5)



def test_token_level_bench_figures():
    from reslm.bench_tokens import run
    r = run(True, CPU, vocab=64, lengths=(4, 12), train_batch=2, train_context=8,
            pair={"laerc": dict(dim=16, n_layers=1), "gpt": dict(dim=16, n_layers=1, n_heads=2)})
    for name in ("laerc", "gpt"):
        t = r[name]
        assert t["train_tokens_per_s"] > 0 and set(t["generation"]) == {4, 12}
        assert all(g["stateful_ms"] > 0 and g["rerun_ms"] > 0 for g in t["generation"].values())
    assert r["laerc"]["fixed_params"] > 0 and r["gpt"]["fixed_params"] == 0
