"""Issue 89, sixth pass: `reslm verify` over a folder of runs from several user files (item 4), a user's reservoir
whose states are not a function of its seed and input caught before its run is published (item 6), and the
`--import` minor cases (item 5: a wrong file named with its sha256, NaN states and a wrong width blamed on the
file, in one line naming it).

The published runs are tiny (a 16-unit reservoir, a few dozen steps) and made inside the tests: two runs from two
user files and one of reslm's own ESN, published with `reslm publish`. Each command runs as in a fresh process:
`fresh()` puts RESERVOIRS and SOURCES back as they were before any file ran, so that only the command's own
--import files register reservoirs."""
import hashlib
import json
import shlex
import shutil
import textwrap
from pathlib import Path

import pytest

from reslm.cli import main
from reslm.frontier.imports import _import
from reslm.reservoir import RESERVOIRS
from reslm.reservoir.registry import SOURCES, source_name
from reslm.train import create_run, train

TINY = dict(batch_size=32, epochs_per_shard=1, epoch_samples=64, lr=3e-3, log_every=4, device="cpu",
            eval_samples=0)
MODEL = dict(size=16, streams=4, head="mlp", head_hidden=8)
RING = textwrap.dedent("""\
    import importlib, os
    import torch
    from reslm.reservoir import ESN, ESNConfig, RESERVOIRS

    importlib.import_module(os.environ.get("RING_NEEDS", "json"))   # a module the file needs (tests: one missing)

    class RingESN(ESN):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.W_T.copy_(cfg.spectral_radius * torch.roll(torch.eye(cfg.size), SHIFT, dims=0))

    RESERVOIRS[NAME] = (ESNConfig, RingESN)
    """)
FORWARD = textwrap.dedent("""\
    import numpy, torch
    from reslm.reservoir import ESN, ESNConfig, RESERVOIRS

    class Mine(ESN):
        def forward(self, u, s0=None, **kw):
            s, last = super().forward(u, s0, **kw)
    {body}
            return s, last

    RESERVOIRS["{name}"] = (ESNConfig, Mine)
    """)
NOISY = "        s = s + torch.from_numpy(numpy.random.default_rng().normal(0, 0.01, s.shape)).to(s.dtype)"
NAN = "        s, last = s * float('nan'), last"
WIDE = "        s, last = torch.cat([s, s], -1), torch.cat([last, last], -1)"


def user_file(folder: Path, name: str, text: str) -> tuple[Path, str]:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(text)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def ring(folder: Path, name: str, shift: int) -> tuple[Path, str]:
    return user_file(folder, name, RING.replace("SHIFT", str(shift)).replace("NAME", repr(name)))


def mine(folder: Path, name: str, body: str) -> tuple[Path, str]:
    return user_file(folder, name, FORWARD.format(body=body, name=name))


def trained(base: Path, chars, name: str, file: Path | None = None):
    """A tiny finished run of the reservoir `name` (from `file`, run with the bench's guarded import)."""
    reservoir = name
    if file is not None:
        (src,) = _import([str(file)])
        reservoir = source_name(name, src["sha256"])
    run = create_run(base / "runs" / name, "rc", dict(MODEL, reservoir=reservoir), TINY, chars)
    train(run, progress=False)
    return run


@pytest.fixture(scope="module")
def saved_registry():
    saved, sources = dict(RESERVOIRS), dict(SOURCES)

    def fresh():
        RESERVOIRS.clear()
        RESERVOIRS.update(saved)
        SOURCES.clear()
        SOURCES.update(sources)
    yield fresh
    fresh()


@pytest.fixture(scope="module")
def published(chars, tmp_path_factory, saved_registry):
    """(results folder, {name: (file, sha256)}): runs of two user files (ring-a, ring-b, in one folder `mine/`)
    and one of reslm's ESN, published in results/."""
    base = tmp_path_factory.mktemp("sixth-verify")
    files = {"ring-a": ring(base / "mine", "ring-a", 1), "ring-b": ring(base / "mine", "ring-b", 2)}
    results = base / "results"
    for name, (file, _) in [*files.items(), ("esn", (None, None))]:
        saved_registry()
        run = trained(base, chars, name, file)
        argv = ["publish", str(run), str(results / name)] + (["--import", str(file)] if file else [])
        assert main(argv) == 0
    saved_registry()
    return results, files


@pytest.fixture
def copy(published, chars, tmp_path, monkeypatch, saved_registry):
    """The published folder copied into this test's folder (the working folder, holding no user file)."""
    results, files = published
    dest = tmp_path / "results"
    shutil.copytree(results, dest)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))
    saved_registry()
    return dest, files


def verify(capsys, fresh, *args) -> tuple[int, list[str], list[str]]:
    fresh()
    rc = main(["verify", *map(str, args), "--readme", "/nonexistent"])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.out.splitlines(), [line for line in out.err.splitlines() if line.strip()]


def lines_of(out: list[str], status: str) -> list[str]:
    return [line for line in out if line.startswith(status)]


# --- item 4: verify over a folder ----------------------------------------------------------------------------
def test_verify_checks_a_folder_with_several_import_files_each_matched_to_its_runs(copy, capsys, saved_registry):
    results, files = copy
    rc, out, err = verify(capsys, saved_registry, results, "--import", files["ring-a"][0], "--import",
                          files["ring-b"][0])
    assert rc == 0, (out, err)
    assert len(lines_of(out, "ok ")) == 3 and "3 ok, 0 differing, 0 unreadable, 0 not checked" in err[-1]


def test_a_run_without_its_file_is_not_checked_and_its_line_gives_the_command_that_checks_it(
        copy, capsys, saved_registry):
    """--import of one file: the other file's run is NOT CHECKED, its line names the command that checks it (its
    file found beside the given one by the name and sha256 it records), exit 3; the command printed for all of
    them checks them all (exit 0)."""
    results, files = copy
    (a, sha_a), (b, sha_b) = files["ring-a"], files["ring-b"]
    rc, out, err = verify(capsys, saved_registry, results, "--import", a)
    assert rc == 3, (out, err)
    (line,) = lines_of(out, "NOT CHECKED")
    want = shlex.join(["reslm", "verify", str(results / "ring-b"), "--readme", "/nonexistent", "--import", str(b)])
    assert str(results / "ring-b") in line and sha_b[:12] in line and f"check it with `{want}`" in line, line
    assert len(lines_of(out, "ok ")) == 2 and "2 ok, 0 differing, 0 unreadable, 1 not checked" in err[0]
    assert err[-1].startswith("reslm: error: 1 of 3 published run(s) not checked")
    (command,) = [e.split(": ", 1)[1] for e in err if e.startswith("to check them: ")]
    assert shlex.split(command) == ["reslm", "verify", str(results), "--readme", "/nonexistent", "--import", str(a),
                                    "--import", str(b)]
    saved_registry()
    assert main(shlex.split(command)[1:]) == 0
    assert len(lines_of(capsys.readouterr().out.splitlines(), "ok ")) == 3
    # the single run's command, as its line gives it, checks it
    saved_registry()
    assert main(shlex.split(want)[1:]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"ok       {results / 'ring-b'}")


def test_without_any_import_each_unchecked_run_names_its_file_and_nothing_is_run(copy, capsys, saved_registry):
    results, files = copy
    rc, out, err = verify(capsys, saved_registry, results)
    assert rc == 3
    unchecked = lines_of(out, "NOT CHECKED")
    assert len(unchecked) == 2 and len(lines_of(out, "ok ")) == 1
    for name, (_, sha) in files.items():
        (line,) = [u for u in unchecked if str(results / name) in u]
        assert sha[:12] in line and f"--import {name}.py`" in line, line   # the file's name: not found here
    assert "the line of each names its file" in err[-1]
    assert not any(k.startswith("ring-") for k in RESERVOIRS)


def test_the_exit_status_says_whether_anything_differs_or_was_not_checked(copy, capsys, saved_registry):
    """0 all checked and equal (above), 1 something differs (even beside runs not checked), 3 only runs not
    checked, 2 bad input; --help says so."""
    results, files = copy
    summary = results / "esn" / "summary.json"
    s = json.loads(summary.read_text())
    s["final_test_loss"] -= 0.05
    summary.write_text(json.dumps(s))
    m = json.loads((results / "esn" / "manifest.json").read_text())
    m["files"]["summary.json"] = hashlib.sha256(summary.read_bytes()).hexdigest()   # a re-hashed edit
    (results / "esn" / "manifest.json").write_text(json.dumps(m))
    rc, out, err = verify(capsys, saved_registry, results)
    assert rc == 1 and len(lines_of(out, "DIFFERS")) == 1 and len(lines_of(out, "NOT CHECKED")) == 2
    assert "do not re-score" in err[-1] and "2 not checked" in err[-1]
    rc, out, err = verify(capsys, saved_registry, results, "--import", files["ring-a"][0], "--import",
                          files["ring-b"][0])
    assert rc == 1 and len(lines_of(out, "ok ")) == 2
    rc, _, err = verify(capsys, saved_registry, results / "nothing-here")
    assert rc == 2 and err[-1].startswith("reslm: error: ")
    assert main(["verify", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit status: 0 every run checked and equal" in text and "1 a run differs" in text
    assert "3 none differs but some run was not checked" in text and "2 bad input" in text


def test_a_file_that_needs_a_module_missing_here_leaves_its_runs_not_checked(copy, capsys, saved_registry,
                                                                             monkeypatch):
    """The README's line names every file of the project's runs; where one cannot run (reservoirpy not
    installed), its runs are not checked, saying why (exit 3), and the others are checked."""
    results, files = copy
    monkeypatch.setenv("RING_NEEDS", "reslm_no_such_module_for_this_test")
    rc, out, err = verify(capsys, saved_registry, results, "--import", files["ring-a"][0], "--import",
                          files["ring-b"][0])
    assert rc == 3
    assert len(lines_of(out, "ok ")) == 1 and len(lines_of(out, "NOT CHECKED")) == 2
    assert all("could not run here" in line and "reslm_no_such_module_for_this_test" in line
               for line in lines_of(out, "NOT CHECKED"))
    assert err[-1].startswith("reslm: error: 2 of 3 published run(s) not checked")


# --- item 5 (minor): a wrong --import file named with its sha256 -----------------------------------------------
def test_a_wrong_import_file_is_named_with_its_sha256_beside_the_one_the_run_records(copy, capsys, saved_registry):
    results, files = copy
    (a, sha_a), (b, sha_b) = files["ring-a"], files["ring-b"]
    rc, out, _ = verify(capsys, saved_registry, results / "ring-a", "--import", b)
    (line,) = lines_of(out, "NOT CHECKED")
    assert rc == 3 and f"(sha256 {sha_a[:12]}), not --import {b} (sha256 {sha_b[:12]})" in line, line
    saved_registry()
    assert main(["eval", str(results / "ring-a"), "--length", "8", "--score", "64", "--import", str(b)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reslm: error: ") and f"not --import {b} (sha256 {sha_b[:12]})" in \
        err[0] and sha_a[:12] in err[0], err


# --- item 6 and item 5: a reservoir whose states cannot be trusted, caught before anything is trained -----------
@pytest.mark.parametrize("body, message", [
    (NOISY, "its states are not a function of its seed and input"),
    (NAN, "its states are not finite (NaN or inf)"),
    (WIDE, "declares size 16 but its forward(u) gave states of shape (2, 16, 32)"),
])
def test_a_reservoir_whose_states_cannot_be_trusted_is_refused_naming_its_file_before_training(
        chars, tmp_path, capsys, registry, monkeypatch, body, message):
    """`reslm frontier bench --import FILE.py` on a reservoir that adds noise from an unseeded generator, returns
    NaN states or states of another width than it declares: one line naming the file, before any step is
    trained (no learning rate blamed, no torch message), and nothing to publish."""
    from reslm.frontier import bench as fbench
    from reslm.frontier import load_plan
    file, _ = mine(tmp_path / "mine", "mine", body)
    plan = tmp_path / "tiny-recipe.toml"
    plan.write_text(textwrap.dedent("""\
        [base]
        label = "tiny-recipe"
        family = "rc"
        data = "tiny"
        model = { size = 16, streams = 1, context_mode = "stream" }
        train = { batch_size = 64, epochs_per_shard = 1, epoch_samples = 128, shard_chars = 0, lr = 3e-3, val_fraction = 0.2, eval_samples = 0 }

        [rule]
        seeds = [0]
        """))
    monkeypatch.setattr(fbench, "recipe_config", lambda *a, **k: load_plan(plan).base)
    monkeypatch.chdir(tmp_path)
    argv = ["frontier", "bench", "--reservoir", "mine", "--import", str(file), "--seeds", "0", "--jobs", "1",
            "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"), "--root",
            str(chars.path.parent), "--no-progress", "--memory-positions", "0"]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"reslm: error: --import {file}: reservoir mine") and message in \
        err[0], err
    assert "--lr" not in err[0] and "expanded size" not in err[0]
    runs = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert runs and not any((r / "checkpoint.pt").exists() or (r / "metrics.jsonl").exists() for r in runs)


def test_a_run_of_a_reservoir_not_a_function_of_its_seed_is_never_published(chars, tmp_path, capsys, registry,
                                                                              monkeypatch):
    """A run trained on such a reservoir where it was not probed (before this check) is refused by `reslm
    publish`, in one line naming the file, and nothing is published."""
    from reslm.frontier import imports
    file, _ = mine(tmp_path / "mine", "noisy", NOISY)
    monkeypatch.setattr(imports, "probe", lambda *a, **k: None, raising=False)   # as before the probe
    run = trained(tmp_path, chars, "noisy", file)
    monkeypatch.undo()
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))
    dest = tmp_path / "results" / "noisy"
    assert main(["publish", str(run), str(dest), "--import", str(file)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"--import {file}: reservoir noisy" in err[0] and \
        "not a function of its seed and input" in err[0], err
    assert not dest.exists()


def test_a_deterministic_reservoir_from_a_file_is_probed_and_passes(tmp_path, registry, monkeypatch):
    """The probe is no obstacle to a reservoir that is a function of its seed and input (examples/ring_esn.py's
    ring, at the bench's size): an instance built for real is probed; a shape-only one is not."""
    import torch
    from reslm.frontier import imports
    from reslm.reservoir import ESNConfig
    (src,) = _import([str(Path(__file__).resolve().parents[2] / "examples" / "ring_esn.py")])
    cls = RESERVOIRS[source_name("ring", src["sha256"])][1]
    probed = []
    real = imports.probe
    monkeypatch.setattr(imports, "probe", lambda *a: probed.append(real(*a)))
    res = cls(ESNConfig(size=750, input_dim=16, seed=3))
    with torch.device("meta"):
        cls(ESNConfig(size=750, input_dim=16, seed=3))
    assert len(probed) == 1 and res.W_T.shape == (750, 750)
