"""The benchmark at tiny sizes: every figure it reports agrees with the raw figures it was computed
from (ratios, the amortised formula, samples per second from the timed seconds), the
re-implementations of the authors' approach compute the same numbers as the models, and bf16 rows
are skipped where bf16 is slow. No absolute speed is asserted anywhere."""
import dataclasses
import json
import math

import pytest
import torch

from reslm.bench import kernels, training
from reslm.bench import run as bench
from reslm.bench import timing as bench_timing
from reslm.bench import tokens as bench_tokens
from reslm.bench import TARGETS, BenchPlan, run_bench
from reslm.bench.training import amortised_samples_per_s
from reslm.bench.timing import timing_model, timing_reservoir
from reslm.models import build_model
from reslm.bench.reference import authors_logits, authors_window_states
from reslm.reservoir import ESNConfig

CPU = torch.device("cpu")
REL = 2e-3  # figures are rounded to 4 significant digits; quotients of rounded figures agree to this

TINY = BenchPlan(batch=16, recurrence_sizes=(32,), recurrence_work=1e5, recurrence_steps=(2, 2),
                 states_sizes=(32,), stream_work=1e5, stream_steps=(3, 3), stream_warmup=2,
                 window_work=1e5, window_samples=(8, 24),
                 models=(("rc-32", "rc", dict(size=32)), ("aerc-24-4", "aerc", dict(size=24, hidden=4)),
                         ("tf-16-2-1", "tf", dict(ff_dim=16, n_heads=2, n_layers=1))),
                 window_models=(("tf-16-2-1", "tf", dict(ff_dim=16, n_heads=2, n_layers=1)),),
                 head_steps=2, authors_steps=1, tf_steps=1, tf_warmup=1, reps=2, max_reps=2, budget_s=5.0,
                 token_level=False, substrate_chars=0)
RESERVOIR_MODELS = ("rc-32", "aerc-24-4")


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
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RESLM_BF16", "1")   # measure the bf16 rows whatever this CPU is
        return run_bench(plan=TINY, device="cpu")


def test_report_has_the_keys_and_is_json(report):
    for key in ("reservoir_gflops", "gemm_gflops", "reservoir_vs_gemm", "reservoir_gflops_bf16",
                "gemm_gflops_bf16", "reservoir_vs_gemm_bf16", "reservoir_chars_per_s", "training",
                "training_samples_per_s", "authors_samples_per_s", "speedup_vs_authors", "authors_quoted",
                "targets", "method", "device", "dtype", "torch", "threads", "batch_size", "seconds",
                "load_average", "contention", "meets_target", "reservoir_chars_per_s_bf16", "recurrence",
                "reservoir_states", "reservoir_states_bf16", "bf16"):
        assert key in report, key
    json.loads(json.dumps(report))
    assert report["bf16"] == "measured"
    assert set(report["reservoir_gflops"]) == {"32"} and set(report["gemm_gflops_bf16"]) == {"32"}
    assert set(report["reservoir_chars_per_s"]) == {"32", "24"}   # plan sizes + the models' sizes
    assert set(report["reservoir_chars_per_s_bf16"]) == {"32"}    # plan sizes only
    assert set(report["speedup_vs_authors"]) == {"rc-32", "aerc-24-4", "tf-16-2-1"}
    assert report["authors_quoted"]["rc-750"] == 4100 and report["authors_quoted"]["tf-128-8-8"] == 737
    assert report["batch_size"] == 16 and report["device"] == "cpu"
    assert set(report["speedup_vs_authors_bf16"]) == {"tf-16-2-1"}   # RESLM_BF16=1: the bf16 transformer row
    tf = report["training"]["tf-16-2-1"]
    assert tf["speedup_vs_authors_bf16"] == pytest.approx(tf["samples_per_s_bf16"] / tf["authors_samples_per_s"],
                                                          rel=REL)
    assert "bf16 autocast" in bench.format_summary(report)
    assert bench.format_summary(report).count("\n") >= 6


def test_all_figures_positive_and_finite(report):
    figures = [*_numbers(report["recurrence"]), *_numbers(report["reservoir_states"]),
               *_numbers(report["reservoir_states_bf16"]),
               *_numbers(report["training"]),
               *_numbers(report["speedup_vs_authors"])]
    assert figures
    for x in figures:
        assert math.isfinite(x) and x > 0


def test_recurrence_ratio_is_the_quotient_of_its_figures(report):
    for dtype, sfx in (("float32", ""), ("bfloat16", "_bf16")):
        r = report["recurrence"][dtype]["32"]
        assert r["dtype"] == dtype and r["reservoir_gflops"] > 0 and r["gemm_gflops"] > 0
        # same flops on both sides: the time ratio is the GFLOP/s ratio
        assert r["reservoir_vs_gemm"] == pytest.approx(r["reservoir_gflops"] / r["gemm_gflops"], rel=REL)
        flops = 2.0 * r["batch"] * r["steps"] * 32 * 32
        assert r["reservoir_gflops"] == pytest.approx(flops / r["reservoir"]["best_s"] / 1e9, rel=REL)
        assert r["reservoir"]["best_s"] <= r["reservoir"]["median_s"]
        for key in ("reservoir_gflops", "gemm_gflops", "reservoir_vs_gemm"):
            assert report[key + sfx]["32"] == r[key]      # the headline is the detail
        assert report["meets_target"]["reservoir_vs_gemm" + sfx]["32"] == (r["reservoir_vs_gemm"] >= 0.8)


def test_states_chars_per_s_is_samples_over_best_seconds(report):
    for key in ("reservoir_states", "reservoir_states_bf16"):
        for n, modes in report[key].items():
            for mode, r in modes.items():
                assert r["chars_per_s"] == pytest.approx(r["samples"] / r["best_s"], rel=REL)
                assert report[key.replace("states", "chars_per_s")][n][mode] == r["chars_per_s"]
    stream = report["reservoir_states"]["32"]["stream"]
    assert stream["streams"] * stream["steps_per_stream"] >= stream["samples"] + TINY.context - 1


def test_training_samples_per_s_is_batch_steps_over_best_seconds(report):
    for label, t in report["training"].items():
        for d in t["detail"].values():
            assert d["samples_per_s"] == pytest.approx(TINY.batch * d["steps"] / d["best_s"], rel=REL)
        assert report["authors_samples_per_s"][label] == t["authors_samples_per_s"]


def test_amortised_figures_and_speedups_follow_the_formula(report):
    for label in RESERVOIR_MODELS:
        t = report["training"][label]
        assert t["head_samples_per_s"] == t["detail"]["head"]["samples_per_s"]
        assert t["authors_samples_per_s"] == t["detail"]["authors"]["samples_per_s"]
        for mode in ("window", "stream"):
            m = t[mode]
            assert m["reservoir_samples_per_s"] == report["reservoir_chars_per_s"][str(t["size"])][mode]
            expect = amortised_samples_per_s(m["reservoir_samples_per_s"], m["head_samples_per_s"], 5)
            assert m["amortised_samples_per_s"] == pytest.approx(expect, rel=1e-3)
            # amortising can only lose against the head alone, and gains against the reservoir alone x 5
            assert m["amortised_samples_per_s"] <= m["head_samples_per_s"] * (1 + 1e-3)
            assert m["amortised_samples_per_s"] <= 5 * m["reservoir_samples_per_s"] * (1 + 1e-3)
            speedup = m["amortised_samples_per_s"] / t["authors_samples_per_s"]
            assert m["speedup_vs_authors"] == pytest.approx(speedup, rel=REL)
            assert report["speedup_vs_authors"][label][mode] == m["speedup_vs_authors"]
            assert report["training_samples_per_s"][label][mode] == dict(
                head=m["head_samples_per_s"], amortised=m["amortised_samples_per_s"])
            target = TARGETS["speedup_vs_authors"][t["family"]]
            assert report["meets_target"]["speedup_vs_authors"][label][mode] == (m["speedup_vs_authors"] >= target)


def test_transformer_speedup_is_ours_over_reference(report):
    t = report["training"]["tf-16-2-1"]
    assert t["samples_per_s"] == t["detail"]["ours"]["samples_per_s"]
    assert t["authors_samples_per_s"] == t["detail"]["authors"]["samples_per_s"]
    assert t["speedup_vs_authors"] == pytest.approx(t["samples_per_s"] / t["authors_samples_per_s"], rel=REL)
    assert report["training_samples_per_s"]["tf-16-2-1"] == t["samples_per_s"]
    assert report["meets_target"]["speedup_vs_authors"]["tf-16-2-1"] == (t["speedup_vs_authors"] >= 3.0)


def test_bf16_rows_are_skipped_where_bf16_is_slow(monkeypatch):
    monkeypatch.setenv("RESLM_BF16", "0")
    plan = BenchPlan(batch=8, recurrence_sizes=(16,), recurrence_work=1e4, recurrence_steps=(2, 2),
                     states_sizes=(16,), stream_work=1e4, stream_steps=(2, 2), stream_warmup=1, window_work=1e4,
                     window_samples=(4, 4), models=(), reps=1, max_reps=1, budget_s=1.0, token_level=False,
                     substrate_chars=0)
    r = run_bench(plan=plan, device="cpu")
    assert r["bf16"].startswith("skipped: no fast bf16 on this CPU")
    assert "bfloat16" not in r["recurrence"] and r["reservoir_gflops_bf16"] == {} and r["reservoir_states_bf16"] == {}
    assert r["reservoir_vs_gemm"]["16"] > 0 and set(r["reservoir_chars_per_s"]["16"]) == {"stream", "window"}
    assert "bf16 skipped" in bench.format_summary(r)


def test_amortised_formula_on_made_up_numbers():
    # reservoir 1000 samples/s -> 1 ms per sample, /5 = 0.2 ms; head 5000 samples/s -> 0.2 ms: 0.4 ms in all
    assert amortised_samples_per_s(1000.0, 5000.0, 5) == pytest.approx(2500.0)
    assert amortised_samples_per_s(1000.0, 5000.0, 1) == pytest.approx(1 / (1e-3 + 2e-4))
    # an infinitely fast reservoir leaves the head; many epochs make the reservoir free
    assert amortised_samples_per_s(1e30, 5000.0) == pytest.approx(5000.0)
    assert amortised_samples_per_s(1000.0, 5000.0, 10**9) == pytest.approx(5000.0)


def test_repeat_alternates_and_respects_reps_and_budget(monkeypatch):
    calls = []
    t = bench_timing.repeat(dict(a=lambda: calls.append("a"), b=lambda: calls.append("b")), CPU, reps=3,
                            budget_s=60)
    assert calls == ["a", "b"] + ["a", "b"] * 3 and len(t["a"]) == len(t["b"]) == 3
    t = bench_timing.repeat(dict(a=lambda: None), CPU, reps=5, budget_s=0.0)
    assert len(t["a"]) == 1  # over budget after the first repetition
    t = bench_timing.repeat(dict(a=lambda: None), CPU, reps=2, budget_s=60, min_time_s=60, max_reps=7)
    assert len(t["a"]) == 7  # cheap: more repetitions, up to max_reps, while under min_time_s
    clock = [1000.0]   # an injected clock: each call of `a` takes exactly 0.25 s of it, and the budget runs out
    monkeypatch.setattr(bench_timing, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    t = bench_timing.repeat(dict(a=lambda: clock.__setitem__(0, clock[0] + 0.25)), CPU, reps=2, budget_s=60,
                            min_time_s=0.0, max_reps=7)
    assert t["a"] == [0.25, 0.25]  # reps reached, min_time_s met: no more
    t = bench_timing.repeat(dict(a=lambda: clock.__setitem__(0, clock[0] + 0.25)), CPU, reps=2, budget_s=60,
                            min_time_s=1.0, max_reps=7)
    assert t["a"] == [0.25] * 4    # more repetitions while under min_time_s (the warm-up call is not timed)
    t = bench_timing.repeat(dict(a=lambda: clock.__setitem__(0, clock[0] + 0.25)), CPU, reps=5, budget_s=0.6)
    assert t["a"] == [0.25] * 3    # never another one once the budget is spent


def test_trainer_steps_cycle_through_batches_and_truncate():
    seen = []
    model = torch.nn.Linear(2, 1)
    run = training.trainer(model, lambda x, y: (None, (seen.append(len(x)), model(x).sum())[1]),
                           [(torch.ones(5, 2), torch.ones(5)), (torch.ones(3, 2), torch.ones(3))], family="rc", lr=1e-3)
    before = model.weight.detach().clone()
    run(3)
    run(2, 1)
    assert seen == [5, 3, 5, 1, 1] and not torch.equal(before, model.weight)


def test_contention_probe_restores_threads():
    torch.set_num_threads(2)
    try:
        p = bench_timing.contention_probe(elems=1024, ops=2)
        assert torch.get_num_threads() == 2 and p["threads"] == 2
    finally:
        torch.set_num_threads(1)
    assert p["multi_ms_per_op"] > 0 and p["single_ms_per_op"] > 0 and isinstance(p["contended"], bool)


def test_plan_sizes():
    full = BenchPlan.full()
    assert {750, 2600} <= set(full.recurrence_sizes) and {750, 2600} <= set(full.states_sizes)
    for N in (100, 750, 2600):
        n = kernels.stream_samples(N, full)
        L = (n + full.context - 1) / full.batch
        assert L == int(L) and full.stream_steps[0] <= L <= full.stream_steps[1]
        assert 1 <= kernels.window_samples(N, full) <= 2**26 // (full.context * N)
    assert {"rc-750", "aerc-100-20", "tf-128-8-8"} <= set(BenchPlan.quick().models)


def test_timing_reservoir_shape_and_scale():
    cfg = ESNConfig(size=200, seed=3)
    esn = timing_reservoir(cfg, CPU)
    assert esn.W_T.shape == (200, 200) and esn.W_in_T.shape == (16, 200) and not esn.W_T.is_meta
    rho = torch.linalg.eigvals(esn.W_T.double()).abs().max().item()
    assert 0.75 < rho < 1.05  # circular-law estimate of 0.9
    states, last = esn(torch.randn(4, 10, 16))
    assert torch.isfinite(states).all() and last.abs().max() <= 1


def _flat(logits):
    return logits.reshape(-1, logits.shape[-1])   # (B, V) or (B, 1, V) -> (B, V)


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
    torch.testing.assert_close(_flat(authors_logits(model, s)), _flat(model.forward_features(model.normalize(s))[0]),
                               rtol=1e-4, atol=1e-5)
    # and the loss the authors' trainer minimises is the model's loss on the same windows
    y = torch.randint(59, (6,))
    loss = torch.nn.functional.cross_entropy(_flat(authors_logits(model, s)), y)
    torch.testing.assert_close(loss, model(windows, y)[1], rtol=1e-4, atol=1e-5)


TOKENS_PAIR = {"laerc": dict(dim=16, n_layers=1), "gpt": dict(dim=16, n_layers=1, n_heads=2)}


def test_token_level_bench_figures():
    r = bench_tokens.run(True, CPU, vocab=64, lengths=(4, 12), train_batch=2, train_context=8, pair=TOKENS_PAIR)
    for name in ("laerc", "gpt"):
        t = r[name]
        assert t["train_tokens_per_s"] > 0 and set(t["generation"]) == {4, 12}
        for g in t["generation"].values():
            assert g["stateful_ms"] > 0 and g["rerun_ms"] > 0
            assert g["speedup"] == pytest.approx(g["rerun_ms"] / g["stateful_ms"], rel=0.05, abs=0.1)
        lo, hi = t["generation"][4], t["generation"][12]
        assert t["growth_long_vs_short"] == pytest.approx(hi["stateful_ms"] / lo["stateful_ms"], rel=1e-2)
        assert t["speedup_vs_rerun_at_longest"] == hi["speedup"]
    assert r["laerc"]["fixed_params"] > 0 and r["gpt"]["fixed_params"] == 0
    assert r["targets"] == bench_tokens.TARGETS


def test_laerc_stateful_generation_does_not_grow_with_the_prefix():
    """A reservoir state has a fixed size: a token after 384 tokens costs what one after 8 costs
    (loose bound: the machine is shared), while re-running the prefix grows with it."""
    model = bench_tokens.build_pair(64, 400, CPU, TOKENS_PAIR)["laerc"]
    g = bench_tokens.generation_ms_per_token(model, (8, 384), CPU, steps=8, reps=3)
    assert g[384]["stateful_ms"] < 3 * g[8]["stateful_ms"]
    assert g[384]["rerun_ms"] > g[8]["rerun_ms"]


def test_substrate_rows(monkeypatch):
    """Every lab substrate's stream states timed (tiny sizes here), relative to the esn's."""
    real = kernels.lab_overrides
    monkeypatch.setattr(kernels, "lab_overrides", lambda name, fam: {**real(name, fam), "size": 48}
                        if name != "nvar" else dict(real(name, fam), size=153, embed_dim=8, reservoir_options="k=2"))
    plan = dataclasses.replace(TINY, substrate_chars=300)
    rows = kernels.substrate_rows(plan, CPU, lambda msg: None)
    assert set(rows) == {*kernels.SUBSTRATES, "diagonal-linear"} and rows["esn"]["vs_esn"] == 1.0
    assert rows["diagonal-linear"]["size"] == rows["diagonal"]["size"] == 48
    for r in rows.values():
        assert r["chars"] == 300 - 32 and r["chars_per_s"] == pytest.approx(r["chars"] / r["best_s"], rel=REL)
        assert r["vs_esn"] == pytest.approx(r["chars_per_s"] / rows["esn"]["chars_per_s"], rel=REL)


def test_only_measures_the_chosen_sections(capsys):
    r = run_bench(plan=TINY, device="cpu", only="recurrence", progress=True)
    assert "[bench] recurrence N=32" in capsys.readouterr().err     # progress lines go to stderr
    assert r["sections"] == ["recurrence"] and r["reservoir_vs_gemm"]["32"] > 0
    assert r["training"] == {} and r["reservoir_states"] == {} and "token_level" not in r
    plan = TINY.only(["training", "states"])     # training keeps the states its reservoir rows need
    assert plan.models == TINY.models and plan.states_sizes == TINY.states_sizes and plan.recurrence_dtypes == ()
    assert TINY.only("training").states_sizes == () and TINY.only("substrates").models == ()
    from reslm.cli import main
    assert main(["bench", "--only", "recurrence,bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown bench section bogus" in err
    assert main(["bench", "--only", ""]) == 2                  # empty: refused, not the whole bench
    assert "unknown bench section (none)" in capsys.readouterr().err


def test_transformer_model_flops_beside_the_same_runs_gemm(report):
    """model GFLOP/s = samples/s x the analytic count; its ratio to the GEMM timed in the same
    repetitions is the quotient of the two reported figures."""
    from reslm.models import make_config
    from reslm.models.transformer import training_flops_per_sample
    t = report["training"]["tf-16-2-1"]
    flops = training_flops_per_sample(make_config("tf", ff_dim=16, n_heads=2, n_layers=1))
    assert t["flops_per_sample"] == pytest.approx(flops, rel=REL)
    assert t["model_gflops"] == pytest.approx(t["samples_per_s"] * flops / 1e9, rel=REL)
    assert t["model_vs_gemm"] == pytest.approx(t["model_gflops"] / t["gemm_gflops"], rel=REL)
    assert report["transformer_vs_gemm"] == {"tf-16-2-1": t["model_vs_gemm"]}
    assert report["transformer_gemm_gflops"]["tf-16-2-1"] == t["gemm_gflops"] > 0
    assert "gemm" not in t["detail"] and t["gemm"]["reps"] == t["detail"]["ours"]["reps"]
    assert "model GFLOP/s" in bench.format_summary(report)


def test_window_step_section_times_fused_and_plain_beside_gemms_of_their_dtype(report):
    """The fused and plain window steps (fp32, and the plain one under bf16 autocast): each rate is batch x
    steps over the best repetition, vs_gemm its model flop rate over the same-dtype GEMM of the same
    repetitions, vs_plain_fp32 its ratio to the plain fp32 step; the fused kernel has no bf16 row."""
    from reslm.models import make_config
    from reslm.models.transformer import training_flops_per_sample
    row = report["window_step"]["tf-16-2-1"]
    flops = training_flops_per_sample(make_config("tf", ff_dim=16, n_heads=2, n_layers=1))
    assert set(row["detail"]) == {"fused_fp32", "plain_fp32", "plain_bf16"} and "fused_bf16" not in row
    for key in ("fused_fp32", "plain_fp32", "plain_bf16"):
        v, raw = row[key], row["detail"][key]
        assert v["windows_per_s"] == pytest.approx(TINY.batch * TINY.tf_steps / raw["best_s"], rel=REL)
        assert v["vs_gemm"] == pytest.approx(v["windows_per_s"] * flops / 1e9 / row["gemm_gflops"][key[-4:]], rel=REL)
        assert v["vs_plain_fp32"] == pytest.approx(v["windows_per_s"] / row["plain_fp32"]["windows_per_s"], rel=REL)
    assert report["window_step_vs_plain_fp32"] == {"tf-16-2-1": row["fused_fp32"]["vs_plain_fp32"]}
    assert report["training"]["tf-16-2-1"]["window_step"] == "fused"
    assert "window step tf-16-2-1 fused fp32" in bench.format_summary(report)
    # the evaluation forward, timed in the same repetitions: fused and plain, each in the forwards it runs
    assert set(row["eval"]) == {f"fused_in_{TINY.batch}", f"plain_in_{TINY.batch}"}   # batch 16: under the cap
    for key, v in row["eval"].items():
        assert v["windows_per_s"] == pytest.approx(TINY.batch * TINY.tf_steps / v["detail"]["best_s"], rel=REL)
        assert v["windows_per_forward"] == TINY.batch and v["detail"]["reps"] == row["detail"]["plain_fp32"]["reps"]
    assert row["eval"][f"plain_in_{TINY.batch}"]["vs_plain"] == 1.0
    assert "evaluation tf-16-2-1 fp32: fused in forwards of 16" in bench.format_summary(report)
    assert TINY.only("training").window_models == () and TINY.only("window").window_models == TINY.window_models
