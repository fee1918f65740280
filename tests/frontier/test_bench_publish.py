"""A published bench run whose reservoir a user's file registered (issue 71, item 5): the run records the file (its
name, sha256 and a copy to read, never run), `reslm publish` carries them into the published folder and its
manifest, and every command that builds the run's model reads it only with `--import FILE.py` of that sha256:
without it, or with another version of the file, one line naming the run, the reservoir, the sha256 and the flag.

Each command runs as in a fresh process: `fresh()` puts the registry back as it was before the bench ran the
file (RESERVOIRS and SOURCES), so that only the command's own --import registers the reservoir."""
import hashlib
import json
import textwrap

import pytest

from reslm.cli import main
from reslm.reservoir.registry import SOURCES
from reslm.run.source import SOURCE, SOURCE_COPY

RECIPE = """
[base]
label = "tiny-recipe"
family = "rc"
data = "tiny"
model = { size = 24, streams = 1, context_mode = "stream" }
train = { batch_size = 64, epochs_per_shard = 1, epoch_samples = 128, shard_chars = 0, lr = 3e-3, val_fraction = 0.2, eval_samples = 0 }

[rule]
seeds = [0]
"""
RING = textwrap.dedent("""\
    import torch
    from reslm.reservoir import ESN, ESNConfig, RESERVOIRS

    class RingESN(ESN):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.W_T.copy_(cfg.spectral_radius * torch.roll(torch.eye(cfg.size), 1, dims=0))

    RESERVOIRS["ring-test"] = (ESNConfig, RingESN)
    """)


def refused(capsys, run, reservoir: str, sha: str) -> str:
    """The one line of a refused command: it names the run, the reservoir, the recorded sha256 and the flag."""
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert "Traceback" not in out.err and len(lines) == 1, lines
    line = lines[0]
    assert str(run) in line and reservoir in line and sha[:12] in line and "--import FILE.py" in line, line
    return line


@pytest.fixture
def published(bench_on, chars, tmp_path, registry, capsys, monkeypatch):
    """(the published folder, the user's file, its sha256, the run folder, fresh): a run of the tiny recipe on the
    user's ring reservoir, trained by `reslm frontier bench --import` and published with `reslm publish --import`
    (the commands find the tiny corpus through RESLM_DATA)."""
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))
    before = dict(registry), dict(SOURCES)

    def fresh():
        for now, then in zip((registry, SOURCES), before):
            now.clear()
            now.update(then)

    user = tmp_path / "ring.py"
    user.write_text(RING)
    sha = hashlib.sha256(user.read_bytes()).hexdigest()
    assert main(["frontier", "bench", "--reservoir", "ring-test", "--import", str(user), *bench_on(RECIPE)("out")]) == 0
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    dest = tmp_path / "results" / run.name
    fresh()
    capsys.readouterr()
    assert main(["publish", str(run), str(dest)]) == 2   # publishing builds the model: the file is needed
    refused(capsys, run, f"ring-test@{sha[:12]}", sha)
    assert not dest.exists()
    fresh()
    assert main(["publish", str(run), str(dest), "--import", str(user)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return dest, user, sha, run, fresh


def test_a_bench_run_records_its_reservoirs_file_and_publish_carries_it(published):
    dest, user, sha, run, _ = published
    for folder in (run, dest):
        record = json.loads((folder / SOURCE).read_text())
        assert record == dict(reservoir=f"ring-test@{sha[:12]}", name="ring-test", file="ring.py", sha256=sha,
                              copy=SOURCE_COPY)
        assert (folder / SOURCE_COPY).read_bytes() == user.read_bytes()
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["files"][SOURCE_COPY] == sha and SOURCE in manifest["files"]


def test_verify_reads_a_published_run_from_a_users_file_only_with_that_file(published, tmp_path, capsys):
    dest, user, sha, _, fresh = published
    reservoir = f"ring-test@{sha[:12]}"
    fresh()
    assert main(["verify", str(dest), "--import", str(user)]) == 0, capsys.readouterr()
    assert capsys.readouterr().out.startswith(f"ok       {dest}")
    fresh()
    assert main(["verify", str(dest)]) == 3   # without it: NOT CHECKED, with the command that checks it
    out = capsys.readouterr()
    line = next(line for line in out.out.splitlines() if line.startswith("NOT CHECKED"))
    assert str(dest) in line and reservoir in line and sha[:12] in line and "--import ring.py" in line, line
    assert "1 not checked" in out.err and "Traceback" not in out.err
    edited = tmp_path / "edited" / "ring.py"   # the same name, another version: another sha256
    edited.parent.mkdir()
    edited.write_text(RING + "# edited\n")
    other = hashlib.sha256(edited.read_bytes()).hexdigest()
    fresh()
    assert main(["verify", str(dest), "--import", str(edited)]) == 3
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("NOT CHECKED"))
    assert reservoir in line and f"not --import {edited} (sha256 {other[:12]})" in line, line
    assert (dest / SOURCE_COPY).read_bytes() == user.read_bytes()   # nothing in the folder changed


def test_eval_and_the_other_readers_take_the_users_file(published, tmp_path, capsys):
    dest, user, sha, run, fresh = published
    reservoir = f"ring-test@{sha[:12]}"
    before = sorted(p.name for p in dest.iterdir())
    for argv in (["eval", str(dest), "--length", "8", "--score", "64"],
                 ["generate", str(run), "--prompt", "to", "--length", "4"],
                 ["memory", str(dest), "--lengths", "1,2", "--positions", "8", "--no-progress"],
                 ["recall", str(dest), "--max-lag", "2", "--fit", "1000", "--score", "1000", "--no-progress"]):
        fresh()
        assert main(argv) == 2, argv
        refused(capsys, argv[1], reservoir, sha)
    assert sorted(p.name for p in dest.iterdir()) == before   # nothing written
    fresh()
    assert main(["eval", str(dest), "--length", "8", "--score", "64", "--json", "--import", str(user)]) == 0
    assert json.loads(capsys.readouterr().out)["score_positions"] == 64
    fresh()
    assert main(["generate", str(run), "--prompt", "to", "--length", "4", "--import", str(user)]) == 0
    assert capsys.readouterr().out.startswith("to")


def test_the_report_leaves_such_a_run_off_the_frontier_page_and_runs_no_file(published, capsys):
    """`reslm report` reads JSON: the frontier page's strict verdict would build the reservoir's configuration
    (the user's class), so the run is left off it with a note, and nothing of the user's is run."""
    from reslm.report.frontier import frontier_points
    dest, _, _, _, fresh = published
    fresh()
    assert [p["name"] for p in frontier_points(dest.parents[1], [])] == []
    err = capsys.readouterr().err
    assert "1 run(s) left off docs/frontier.md" in err and dest.name in err


def test_a_copy_that_is_not_the_recorded_file_is_named_and_a_published_one_differs(published, capsys):
    """The copy is hashed at every read, never run: an edited copy is one line naming it (the run folder), and a
    published folder's edited copy fails its manifest in `reslm verify`."""
    dest, user, _, run, fresh = published
    for folder in (run, dest):
        (folder / SOURCE_COPY).write_text("raise SystemExit('the copy was run')\n")
    fresh()
    assert main(["eval", str(run), "--length", "8", "--score", "64", "--import", str(user)]) == 2
    out = capsys.readouterr()
    assert f"{run / SOURCE_COPY} is not the file that {SOURCE} records" in out.err and "Traceback" not in out.err
    fresh()
    assert main(["verify", str(dest), "--import", str(user)]) == 1
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("DIFFERS"))
    assert SOURCE_COPY in line and "does not match its sha256" in line, line
