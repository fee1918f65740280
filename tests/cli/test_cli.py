"""End to end through the command line on a tiny corpus: data -> train -> resume -> generate,
plus every bad input the issue lists (one line on stderr, exit != 0, nothing left behind)."""
import json
import random
import subprocess
import sys

import pytest

import reslm.train
from reslm.cli import main
from reslm.core import stop
from reslm.run import load_checkpoint, read_metrics

FAST = ["--epochs-per-shard", "1", "--batch-size", "64", "--lr", "3e-3", "--no-progress"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    rnd = random.Random(0)
    words = "to be or not that is the question whether tis nobler in the mind to suffer".split()
    (d / "a.txt").write_text(" ".join(rnd.choice(words) for _ in range(1500)) + "\n")
    assert main(["data", "text", str(d / "a.txt"), "--name", "tiny", "--root", str(d / "data")]) == 0
    return d


def train(corpus, out, *extra):
    return main(["train", "--data", "tiny", "--root", str(corpus / "data"), "--out", str(out), *FAST, *extra])


def err_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("reslm: error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


@pytest.mark.parametrize("preset,extra", [("rc-250", []), ("aerc-75-13", ["--context-mode", "window"]),
                                          ("tf-64-4-4", [])])
def test_data_train_generate(corpus, tmp_path, capsys, preset, extra):
    run = tmp_path / "run"
    assert train(corpus, run, "--preset", preset, *extra) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["evaluations"] == 5 and summary["final_test_loss"] < 2.5   # ln 16 = 2.77 at chance
    rows = read_metrics(run)
    assert {r["kind"] for r in rows} >= {"eval"} and all("test_bpc" in r for r in rows if r["kind"] == "eval")
    assert main(["generate", str(run), "--prompt", "To be", "--length", "40", "--seed", "3"]) == 0
    text = capsys.readouterr().out[:-1]                                # print's newline
    assert text.startswith("To be") and len(text) == 45
    assert main(["generate", str(run), "--prompt", "To be", "--length", "40", "--seed", "3"]) == 0
    assert capsys.readouterr().out[:-1] == text                        # same seed, same sample
    # reslm eval: test CE on a fixed chunk, a closed-loop sample, overlap / distinct-n, timings
    assert main(["eval", str(run), "--length", "120", "--score", "600", "--ngrams", "3,7", "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["score_positions"] == 600 and len(ev["sample"]) == 120 and set(ev["overlap"]) == {"3", "7"}
    assert 0 < ev["overlap"]["3"] <= 1 and 0 < ev["distinct"]["3"] <= 1 and ev["test_loss"] < 2.77
    assert 0 <= ev["generation_reservoir_seconds"] <= ev["generation_seconds"]
    assert (ev["score_reservoir_seconds"] > 0) == (preset != "tf-64-4-4")
    assert json.loads((run / "eval.json").read_text())["sample"] == ev["sample"]
    assert main(["eval", str(run), "--length", "120", "--score", "600", "--ngrams", "3,7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sample"] == ev["sample"]    # same seed, same sample
    assert main(["eval", str(run), "--ngrams", "7,x"]) == 2
    err_line(capsys)
    if preset == "rc-250":   # a stream-trained reservoir on the paper's window metric: its own file
        assert main(["eval", str(run), "--context-mode", "window", "--length", "20", "--score", "60",
                     "--ngrams", "3", "--json"]) == 0
        window = json.loads(capsys.readouterr().out)
        assert window["context_mode"] == "window" and (run / "eval-window.json").is_file()
        assert json.loads((run / "eval.json").read_text())["sample"] == ev["sample"]   # eval.json as it was


def test_same_seed_same_losses(corpus, tmp_path, capsys):
    for name in ("a", "b"):
        assert train(corpus, tmp_path / name, "--preset", "tf-64-4-4", "--seed", "7", "--epoch-samples", "256") == 0
    losses = [[r["test_loss"] for r in read_metrics(tmp_path / n) if r["kind"] == "eval"] for n in "ab"]
    assert losses[0] == losses[1]


def test_resume_equals_uninterrupted(corpus, tmp_path, capsys, monkeypatch):
    assert train(corpus, tmp_path / "full", "--preset", "aerc-75-13") == 0
    real_save, calls = reslm.train.loop.save_checkpoint, []

    def save_then_die(*a, **k):             # the process is killed right after its 2nd checkpoint
        real_save(*a, **k)
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(reslm.train.loop, "save_checkpoint", save_then_die)
    assert train(corpus, tmp_path / "cut", "--preset", "aerc-75-13") == 130
    monkeypatch.setattr(reslm.train.loop, "save_checkpoint", real_save)
    assert len([r for r in read_metrics(tmp_path / "cut") if r["kind"] == "eval"]) == 2
    assert train(corpus, tmp_path / "cut", "--resume") == 0
    full, cut = (read_metrics(tmp_path / n) for n in ("full", "cut"))
    key = lambda rows: [(r["index"], r["train_loss"], r["test_loss"]) for r in rows if r["kind"] == "eval"]
    assert key(full) == key(cut)


def test_resume_with_more_cycles_goes_on(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(corpus, run, "--family", "aerc", "--size", "24", "--hidden", "4", "--epoch-samples", "128") == 0
    assert json.loads(capsys.readouterr().out)["evaluations"] == 5
    assert train(corpus, run, "--resume", "--cycles", "2") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["evaluations"] == 10 and "goes on to 2 cycles" in err
    assert train(corpus, run, "--resume", "--cycles", "1") == 0           # fewer: ignored, said so
    assert "other flags ignored" in capsys.readouterr().err
    # no run there: that is the one line, not argparse's "unrecognized arguments" for the family's flags
    assert train(corpus, tmp_path / "none", "--resume", "--cycles", "2") == 2
    assert "holds no run to resume" in err_line(capsys)


def test_presets_json(capsys):
    assert main(["presets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len([r for r in rows if r["paper_trainable_params"]]) == 15 and {"name", "family", "trainable_params", "fixed_params", "config"} <= set(rows[0])


def test_bad_inputs(corpus, tmp_path, capsys):
    data = ["--root", str(corpus / "data")]
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    cases = [
        ["data", "text", str(tmp_path / "missing.txt"), "--name", "x", "--root", str(tmp_path / "d")],
        ["data", "text", str(tmp_path / "empty.txt"), "--name", "x", "--root", str(tmp_path / "d")],
        ["data", "text", str(tmp_path / "latin1.txt"), "--name", "x", "--root", str(tmp_path / "d")],
        ["train", "--preset", "rc-751", "--data", "tiny", *data, "--out", str(tmp_path / "r1")],
        ["train", "--preset", "rc-250", "--spectral-radius", "0", "--data", "tiny", *data, "--out", str(tmp_path / "r2")],
        ["train", "--family", "aerc", "--size", "10", "--hidden", "20", "--data", "tiny", *data, "--out", str(tmp_path / "r3")],
        ["train", "--preset", "tf-64-4-4", "--context", "100000", "--data", "tiny", *data, "--out", str(tmp_path / "r4")],
        ["train", "--preset", "rc-250", "--data", "nope", *data, "--out", str(tmp_path / "r5")],
        ["train", "--preset", "rc-250", "--batch-size", "0", "--data", "tiny", *data, "--out", str(tmp_path / "r6")],
        ["train", "--preset", "rc-250", "--checkpoint-minutes", "-1", "--data", "tiny", *data, "--out", str(tmp_path / "r7")],
        ["train", "--preset", "tf-64-4-4", "--cache-states", "--data", "tiny", *data, "--out", str(tmp_path / "r8")],
        ["generate", str(tmp_path), "--prompt", "to be"],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err_line(capsys)
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())
    assert not any((tmp_path / f"r{i}").exists() for i in range(1, 9))


def test_bad_prompt_and_existing_run(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(corpus, run, "--preset", "rc-250") == 0
    before = (run / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "to be #"]) == 2
    assert "'#'" in err_line(capsys)
    assert train(corpus, run, "--preset", "rc-250") == 2                # exists, no --resume
    err_line(capsys)
    assert (run / "checkpoint.pt").read_bytes() == before


def test_console_script_prints_one_line_on_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "reslm.cli", "generate", str(tmp_path), "--prompt", "x"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_data_bpe_command(corpus, tmp_path, capsys):
    pytest.importorskip("tokenizers")
    root = str(tmp_path / "tok")
    assert main(["data", "bpe", "--corpus", str(corpus / "a.txt"), "--tokenizer", "bpe:300", "--root", root,
                 "--name", "t"]) == 0
    assert "vocabulary 300" in capsys.readouterr().out
    assert main(["data", "bpe", "--corpus", str(corpus / "a.txt"), "--tokenizer", "wordpiece", "--root", root]) == 2
    err_line(capsys)


@pytest.mark.parametrize("family,extra", [("laerc", []), ("gpt", ["--n-heads", "2"])])
def test_token_level_train_resume_generate(corpus, tmp_path, capsys, family, extra):
    """reslm data bpe -> reslm train --family laerc|gpt -> --resume -> reslm generate."""
    pytest.importorskip("tokenizers")
    root = str(tmp_path / "tok")
    assert main(["data", "bpe", "--corpus", str(corpus / "a.txt"), "--tokenizer", "bpe:300", "--root", root,
                 "--name", "t", "--val-fraction", "0.2"]) == 0
    capsys.readouterr()
    run = str(tmp_path / "run")
    argv = ["train", "--family", family, "--data", "t", "--root", root, "--out", run, "--dim", "16",
            "--n-layers", "1", "--context", "32", "--batch-size", "4", "--grad-accum", "1", "--max-steps", "6",
            "--warmup-steps", "2", "--eval-every", "3", "--eval-batches", "2", "--no-progress", *extra]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 6
    assert main(["train", "--out", run, "--resume", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["generate", run, "--prompt", "to be", "--length", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("to be")
    # past the context (32): the state is rebuilt from the last half context, generation goes on
    assert main(["eval", run, "--length", "80", "--score", "64", "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["kind"] == "tokens" and ev["score_positions"] == 64 and ev["test_bpc"] > 0
    assert main([*argv[:7], "--out", str(tmp_path / "bad"), "--size", "10"]) == 2    # not a laerc/gpt option
    err_line(capsys)
    assert not (tmp_path / "bad").exists()


def test_no_reservoir_ablation_flag(corpus, tmp_path, capsys):
    """laerc's --no-reservoir (the feed-forward ablation) is its own flag, not rc's --reservoir NAME."""
    pytest.importorskip("tokenizers")
    root = str(tmp_path / "tok")
    assert main(["data", "bpe", "--corpus", str(corpus / "a.txt"), "--tokenizer", "bpe:300", "--root", root,
                 "--name", "t", "--val-fraction", "0.2"]) == 0
    run = tmp_path / "abl"
    assert main(["train", "--family", "laerc", "--data", "t", "--root", root, "--out", str(run), "--dim", "16",
                 "--n-layers", "1", "--context", "16", "--batch-size", "2", "--grad-accum", "1", "--max-steps", "2",
                 "--eval-every", "2", "--eval-batches", "1", "--no-reservoir", "--no-progress"]) == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["model"]["no_reservoir"] is True and cfg["model"]["reservoir"] == "esn"
    var = tmp_path / "authors"
    assert main(["train", "--family", "laerc", "--data", "t", "--root", root, "--out", str(var), "--dim", "16",
                 "--n-layers", "1", "--context", "16", "--batch-size", "2", "--grad-accum", "1", "--max-steps", "20",
                 "--eval-every", "20", "--eval-batches", "1", "--authors-variant", "--lr", "1e-3", "--no-progress"]) == 0
    cfg = json.loads((var / "config.json").read_text())
    assert cfg["model"]["gate_layers"] == 2 and cfg["model"]["embed_lr_mult"] == 0.2
    assert cfg["train"]["lr"] == 1e-3 and cfg["train"]["hold_steps"] == 2   # an explicit flag wins
    capsys.readouterr()
    assert main(["train", "--family", "rc", "--no-reservoir"]) == 2     # rc's --reservoir takes a name
    err_line(capsys)


def test_train_help_shows_the_familys_defaults(capsys):
    for fam, flag, default in (("rc", "--lr", "0.0001"), ("laerc", "--lr", "0.0006"), ("gpt", "--context", "512"),
                               ("rc", "--context", "32")):
        assert main(["train", "--family", fam, "--help"]) == 0
        out = capsys.readouterr().out
        line = " ".join(out.split("\n  " + flag + " ", 1)[1].split("\n  --")[0].split())
        assert f"(default {default})" in line, (fam, flag, line)
    assert main(["train", "--help"]) == 0
    assert "--family F --help" in capsys.readouterr().out


def test_sigterm_stops_training_at_the_end_of_its_step_as_its_deadline_does(chars, tmp_path):
    """`kill PID` (SIGTERM) stops `reslm train` at the end of the step it is in, as a deadline does: exit 0,
    a checkpoint and the summary of that step (--resume continues); the command's handler removed and
    the stop forgotten afterwards."""
    import signal
    import reslm.train.loop as loop
    from reslm.cli import main
    real, calls = loop.train_step, []

    def step_then_term(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            signal.raise_signal(signal.SIGTERM)
        return real(*a, **k)

    before = signal.getsignal(signal.SIGTERM)
    loop.train_step = step_then_term
    try:
        code = main(["train", "--family", "tf", "--data", str(chars.path), "--out", str(tmp_path / "r"),
                     "--ff-dim", "16", "--n-heads", "2", "--n-layers", "1", "--batch-size", "64",
                     "--epochs-per-shard", "1", "--epoch-samples", "128", "--device", "cpu", "--no-progress"])
    finally:
        loop.train_step = real
    assert code == 0 and len(calls) == 3
    assert load_checkpoint(tmp_path / "r")["step"] == 3   # the step it was in, finished
    assert not json.loads((tmp_path / "r" / "summary.json").read_text())["finished"]
    assert signal.getsignal(signal.SIGTERM) == before and not stop.requested()
