"""The recorded substrate (reservoir/recorded.py, substrate.py): a drive exported, played by a simulated
device (an in-process ESN, with or without noise), imported, and trained on like in-process states;
the checks that tie a recording to its token stream, each a one-line error."""
import json
import random
import shutil

import numpy as np
import pytest
import torch

from reslm.cli import main
from reslm.data import prepare_text
from reslm.core.errors import ReslmError
from reslm.scoring.evaluate import evaluate_run
from reslm.generate import sample
from reslm.models import build_model, make_config
from reslm.reservoir.recorded import MANIFEST, TOKENS_FILE, StateFile
from reslm.recording import DRIVE_FILE, EMBEDDING_FILE, export_drive, import_states, simulate
from reslm.train import create_run, train

N = 24
TRAIN = dict(epochs_per_shard=1, batch_size=128, lr=3e-3, log_every=4, eval_samples=0)


@pytest.fixture(scope="module")
def rec(tmp_path_factory, chars):
    """A drive of the tiny dataset, its noiseless ESN states and the imported substrate."""
    root = tmp_path_factory.mktemp("rec")
    export_drive(chars, root / "drive", embed_dim=16, seed=0)
    simulate(root / "drive", root / "states.npy", reservoir="esn", size=N)
    import_states(root / "states.npy", root / "drive", root / "sub")
    return root


def losses(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["kind"], r["step"], r["train_loss"], r.get("test_loss")) for r in rows if r["kind"] != "states"]


def recorded(path, **kw):
    return dict(reservoir="recorded", reservoir_options=f"path={path}", **kw)


def test_drive_files(rec, chars):
    m = json.loads((rec / "drive" / MANIFEST).read_text())
    drive, E = np.load(rec / "drive" / DRIVE_FILE), np.load(rec / "drive" / EMBEDDING_FILE)
    ids = np.load(rec / "drive" / TOKENS_FILE)
    assert drive.dtype == np.float32 and drive.shape == (len(chars), 16) == tuple(m["shape"])
    assert np.array_equal(ids, np.asarray(chars.tokens)) and np.array_equal(drive, E[ids])
    model = build_model("rc", vocab_size=chars.vocab_size, size=N)          # the model's own embedding
    assert np.array_equal(E, model.embedding.numpy())
    assert m["dataset"]["fingerprint"] == chars.fingerprint() and m["protocol"]["reset"] == "shard"


@pytest.mark.parametrize("family", ["rc", "aerc"])
def test_round_trip_is_exact(rec, chars, tmp_path, capsys, family):
    """export -> simulate (no noise) -> import -> train: the losses and test CE of the in-process ESN in
    the matching layout (stream context, one stream per shard), to the bit; `reslm eval` agrees."""
    extra = dict(hidden=4) if family == "aerc" else {}
    create_run(tmp_path / "ref", family, dict(size=N, streams=1, **extra), TRAIN, chars)
    create_run(tmp_path / "rec", family, recorded(rec / "sub", **extra), TRAIN, chars)
    ref, got = train(tmp_path / "ref", progress=False), train(tmp_path / "rec", progress=False)
    assert got["final_test_loss"] == ref["final_test_loss"] and losses(tmp_path / "rec") == losses(tmp_path / "ref")
    assert json.loads((tmp_path / "rec" / "config.json").read_text())["model"]["size"] == N   # from the file
    e_ref = evaluate_run(tmp_path / "ref", length=20, score=0, write=False)
    e_rec = evaluate_run(tmp_path / "rec", length=20, score=0, write=False)
    assert e_rec["test_loss"] == e_ref["test_loss"] == pytest.approx(ref["final_test_loss"], rel=1e-6)  # other batches
    assert e_rec["sample"] == "" and e_rec["overlap"] == {} and "note" in e_rec
    assert main(["eval", str(tmp_path / "rec"), "--length", "20"]) == 0
    assert "no sample: a recorded substrate" in capsys.readouterr().out


def test_states_are_memory_mapped(rec, chars):
    model = build_model("rc", make_config("rc", vocab_size=chars.vocab_size, **recorded(rec / "sub")))
    a, b = chars.shards[2]
    tokens = torch.from_numpy(np.asarray(chars.tokens[a:b], dtype=np.int64))
    feats = model.features(tokens, position=a)
    assert isinstance(model.reservoir._states._array, np.memmap)      # the file is mapped, not loaded
    assert feats.inputs.shape == (b - a - 32, N) and torch.equal(feats.targets, tokens[32:])
    with pytest.raises(ReslmError, match="not the ones"):
        model.features(tokens, position=a + 1)                          # another span of the stream
    with pytest.raises(ReslmError, match="position of the tokens"):
        model.features(tokens)


def test_safetensors_reads_the_same(rec, chars, tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    states = np.load(rec / "states.npy")
    st.save_file({"states": states}, tmp_path / "s.safetensors")
    import_states(tmp_path / "s.safetensors", rec / "drive", tmp_path / "sub")
    f = StateFile(tmp_path / "s.safetensors")
    assert f.shape == states.shape and f.dtype == "float32" and torch.equal(f.rows(5, 9), torch.from_numpy(states[5:9]))
    create_run(tmp_path / "a", "rc", recorded(rec / "sub"), TRAIN, chars)
    create_run(tmp_path / "b", "rc", recorded(tmp_path / "sub"), TRAIN, chars)
    assert train(tmp_path / "a", progress=False)["final_test_loss"] == train(tmp_path / "b", progress=False)["final_test_loss"]
    st.save_file({"states": states}, tmp_path / "t.safetensors", metadata={"tokens_sha256": "0" * 64})
    with pytest.raises(ReslmError, match="another token stream: its metadata"):
        import_states(tmp_path / "t.safetensors", rec / "drive", tmp_path / "sub2")


def test_noise_is_seeded(rec, tmp_path):
    simulate(rec / "drive", tmp_path / "a.npy", size=N, noise=0.05, noise_seed=1)
    simulate(rec / "drive", tmp_path / "b.npy", size=N, noise=0.05, noise_seed=1)
    a, b, clean = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"), np.load(rec / "states.npy")
    assert np.array_equal(a, b) and abs(float((a - clean).std()) - 0.05) < 0.005


def test_import_refuses_bad_states(rec, tmp_path):
    states = np.load(rec / "states.npy")
    cases = {"rows but the drive has": states[:-1], "must be \\(T, N\\)": states[:, 0],
             "row 1,200 \\(shard 1, position 36\\) holds a non-finite": states.copy(),
             "must be float16": states.astype(np.int32)}
    cases["row 1,200 \\(shard 1, position 36\\) holds a non-finite"][1200, 3] = np.nan
    for i, (msg, arr) in enumerate(cases.items()):
        np.save(tmp_path / f"{i}.npy", arr)
        with pytest.raises(ReslmError, match=msg):
            import_states(tmp_path / f"{i}.npy", rec / "drive", tmp_path / f"sub{i}")
        assert not (tmp_path / f"sub{i}").exists()
    with pytest.raises(ReslmError, match="another token stream: --tokens-sha256"):
        import_states(rec / "states.npy", rec / "drive", tmp_path / "x", tokens_sha="f" * 64)


def test_checksum_ties_the_tokens(rec, chars, tmp_path):
    """A drive whose tokens no longer match their sha256, a states file changed after import: refused."""
    shutil.copytree(rec / "drive", tmp_path / "drive")
    ids = np.load(tmp_path / "drive" / TOKENS_FILE)
    ids[7] = (ids[7] + 1) % 5
    np.save(tmp_path / "drive" / TOKENS_FILE, ids)
    with pytest.raises(ReslmError, match="does not match the tokens sha256"):
        import_states(rec / "states.npy", tmp_path / "drive", tmp_path / "sub")
    np.save(tmp_path / "s.npy", np.load(rec / "states.npy"))
    import_states(tmp_path / "s.npy", rec / "drive", tmp_path / "sub")
    np.save(tmp_path / "s.npy", np.load(rec / "states.npy")[:, ::-1].copy())   # same size, other content
    model = build_model("rc", make_config("rc", vocab_size=chars.vocab_size, **recorded(tmp_path / "sub")))
    with pytest.raises(ReslmError, match="changed since it was imported"):
        model.features(torch.zeros(40, dtype=torch.long), position=0)


def test_wrong_dataset_is_refused(rec, tmp_path):
    rng = random.Random(1)
    words = "to be or not that is the question whether tis nobler in mind".split()
    (tmp_path / "b.txt").write_text(" ".join(rng.choice(words) for _ in range(1500)))
    other = prepare_text([tmp_path / "b.txt"], tmp_path, name="other", verbose=False)
    create_run(tmp_path / "run", "rc", recorded(rec / "sub"), TRAIN, other)
    with pytest.raises(ReslmError, match="not the ones the substrate"):
        train(tmp_path / "run", progress=False)


def test_what_a_recording_cannot_do(rec, chars, tmp_path):
    with pytest.raises(ReslmError, match="context mode stream only"):
        make_config("rc", **recorded(rec / "sub", context_mode="window"))
    with pytest.raises(ReslmError, match="size 750 .* is not the 24"):
        make_config("rc", **recorded(rec / "sub", size=750))
    with pytest.raises(ReslmError, match="needs path="):
        make_config("laerc", reservoir="recorded")
    with pytest.raises(ReslmError, match="cannot be driven"):
        simulate(rec / "drive", tmp_path / "x.npy", reservoir="recorded")
    model = build_model("rc", make_config("rc", vocab_size=chars.vocab_size, **recorded(rec / "sub")))
    with pytest.raises(ReslmError, match="cannot read new input"):
        sample(model, [1, 2, 3], 5)


def test_cli(rec, chars, tmp_path, capsys):
    root = str(chars.path.parent)
    assert main(["substrate", "simulate", "--help"]) == 0 and "--noise" in capsys.readouterr().out
    assert main(["substrate", "export", "--data", "tiny", "--root", root, "--out", str(tmp_path / "d"),
                 "--embed-dim", "4", "--no-progress"]) == 0
    assert main(["substrate", "simulate", str(tmp_path / "d"), "--size", "8", "--noise", "0.01", "--spectral-radius",
                 "0.5", "--out", str(tmp_path / "s.npy"), "--no-progress"]) == 0
    assert main(["substrate", "import", str(tmp_path / "s.npy"), "--drive", str(tmp_path / "d"),
                 "--out", str(tmp_path / "sub"), "--no-progress"]) == 0
    assert "--reservoir recorded" in capsys.readouterr().out
    cfg = make_config("rc", **recorded(tmp_path / "sub"))
    assert (cfg.size, cfg.embed_dim) == (8, 4)
    np.save(tmp_path / "short.npy", np.load(tmp_path / "s.npy")[1:])
    for argv in (["substrate", "import", str(tmp_path / "s.npy"), "--drive", str(tmp_path / "d"), "--out",
                  str(tmp_path / "sub")],                                       # exists already
                 ["substrate", "import", str(tmp_path / "short.npy"), "--drive", str(tmp_path / "d"), "--out",
                  str(tmp_path / "sub2")],                                      # a row short
                 ["substrate", "simulate", str(tmp_path / "nodrive"), "--out", str(tmp_path / "x.npy")],
                 ["substrate", "export", "--data", "tiny", "--root", root, "--out", str(tmp_path / "d")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("reslm: error:") and err.count("\n") == 1
    assert not (tmp_path / "sub2").exists() and not (tmp_path / "x.npy").exists()
