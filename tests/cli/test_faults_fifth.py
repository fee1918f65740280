"""The fifth fault probe (issue 72), each case refused with one line or made safe: the command lines
`reslm frontier run --commands` prints are pasted into bash with hostile arguments (a stub `reslm` records
what each line asked for, so nothing trains and anything injected would show as a PWNED file)."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reslm.cli import main
from reslm.frontier import load_plan
from reslm.frontier import schedule as fschedule
from reslm.frontier.schedule import command_args, score_args

PLAN = """
[base]
label = "b"
family = "rc"
data = "tiny"
model = { size = 30, streams = 8 }
train = { batch_size = 64, epochs_per_shard = 1, epoch_samples = 128, lr = 3e-3, val_fraction = 0.2, eval_samples = 100 }

[rule]
seeds = [0, 1]
"""


def one_error(capsys) -> str:
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("reslm: error: ") and "Traceback" not in out.err, out.err
    assert not out.out.strip(), out.out   # nothing printed for a shell
    return lines[0]


def stub_bin(tmp_path: Path) -> tuple[Path, Path]:
    """A folder holding a `reslm` that only records its arguments, one JSON list a line, in the calls file."""
    folder, calls = tmp_path / "stub-bin", tmp_path / "calls.jsonl"
    folder.mkdir()
    (folder / "reslm").write_text(f"#!{sys.executable}\nimport json, sys\n"
                                  f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    (folder / "reslm").chmod(0o755)
    return folder, calls


def paste(lines: list[str], tmp_path: Path) -> list[list[str]]:
    """Run the lines as bash runs a pasted script (PATH: the stub first, then the system's `touch` & co.);
    returns the argument lists the stub `reslm` was called with."""
    folder, calls = stub_bin(tmp_path) if not (tmp_path / "stub-bin").exists() else (tmp_path / "stub-bin",
                                                                                      tmp_path / "calls.jsonl")
    calls.unlink(missing_ok=True)
    for line in lines:
        assert subprocess.run(["bash", "-n", "-c", line]).returncode == 0, line   # each line parses alone
    subprocess.run(["bash", "-c", "\n".join(lines)], cwd=tmp_path,
                   env={"PATH": f"{folder}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert not pwned(tmp_path), "a pasted line ran a command of its own"
    return [json.loads(c) for c in calls.read_text().splitlines()] if calls.exists() else []


def pwned(tmp_path: Path) -> list[Path]:
    return [p for p in tmp_path.rglob("*") if p.name.startswith("PWNED")]


def test_printed_commands_are_safe_to_paste_and_still_work(tmp_path, chars, monkeypatch, capsys):
    """Hostile plan path, --results, --runs and --root: pasted into bash nothing is run but reslm, each with
    exactly its arguments; the `# = reslm train ... && reslm publish ...` part too; and a line run for real
    trains and publishes into the hostile folders."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my plans").mkdir()
    plan = Path("my plans") / "x$(touch PWNED-plan).toml"
    plan.write_text(textwrap.dedent(PLAN))
    results, runs, root = "-r;touch PWNED-results;", "u$(touch PWNED-runs)", "d`touch PWNED-root` x"
    shutil.copytree(chars.path, Path(root) / chars.path.name)
    argv = ["frontier", "run", str(plan), "--commands", f"--results={results}", "--runs", runs, "--root", root,
            "--threads", "1"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    p = load_plan(plan)
    names = [p.base.name(0), p.base.name(1)]
    want = [command_args(p, n, Path(results), Path(runs), 1, Path(root)) for n in names]
    assert len(lines) == 2 and paste(lines, tmp_path) == want and not pwned(tmp_path)
    assert want[0][want[0].index("--results") + 1] == f"./{results}"   # never read as a flag
    # what each line amounts to, after `#`: `reslm train ... && reslm publish RUN RESULT`, as safe
    said = paste([line.split("   # = ", 1)[1] for line in lines], tmp_path)
    assert [c[0] for c in said] == ["train", "publish"] * 2 and not pwned(tmp_path)
    assert said[1] == ["publish", str(Path(runs) / names[0]), f"./{results}/{names[0]}"]
    assert said[0][said[0].index("--out") + 1] == str(Path(runs) / names[0])
    # the first line, run for real, trains and publishes that run into the hostile folders
    assert main(want[0]) == 0
    assert (Path(results) / names[0] / "manifest.json").is_file() and not pwned(tmp_path)
    # a scoring line (`reslm eval RUN ...`) for the published run, pasted: as safe
    monkeypatch.setattr(fschedule, "to_score", lambda plan, table: [e for e in table if e.state == "done"])
    capsys.readouterr()
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert paste(lines, tmp_path) == [want[1], score_args(Path(results) / names[0], 1, Path(root))]
    assert not pwned(tmp_path)


@pytest.mark.parametrize("where", ["plan", "--results", "--runs", "--root"])
def test_a_newline_in_a_printed_argument_is_refused(tmp_path, monkeypatch, capsys, where):
    """A newline would end the line a scheduler reads and the `#` comment after it: one line, nothing printed."""
    monkeypatch.chdir(tmp_path)
    hostile = "x\ntouch PWNED"
    plan = Path(f"{hostile}.toml" if where == "plan" else "p.toml")
    plan.write_text(textwrap.dedent(PLAN))
    argv = ["frontier", "run", str(plan), "--commands"] + ([where, hostile] if where != "plan" else [])
    assert main(argv) == 2
    line = one_error(capsys)
    assert "newline" in line and (where == "plan" or f"the value of {where}" in line)
    assert not pwned(tmp_path)


# --- 72.2: a user's reservoir never passes for a built-in one -------------------------------------------------
@pytest.fixture
def no_data(monkeypatch):
    """The bench stops where it would open its dataset: these tests never get as far as training."""
    from reslm.core.errors import ReslmError
    from reslm.frontier import bench as fbench

    def stop(*args, **kw):
        raise ReslmError("got past --import")
    monkeypatch.setattr(fbench, "find_dataset", stop)


def bench_argv(tmp_path, *files, reservoir="ring"):
    return (["frontier", "bench", "--reservoir", reservoir, "--out", str(tmp_path / "out"), "--results",
             str(tmp_path / "results")] + [w for f in files for w in ("--import", str(f))])


@pytest.mark.parametrize("body, changed", [
    ('RESERVOIRS["esn"] = RESERVOIRS["leaky"]', "esn"),
    ('del RESERVOIRS["gru"]', "gru"),
    ('RESERVOIRS["ring"] = RESERVOIRS["esn"]\nESN.forward = lambda self, u, s0=None: (u, u)', "ESN.forward"),
    ('RESERVOIRS["ring"] = RESERVOIRS["esn"]\nESNConfig.validate = lambda self: None', "ESNConfig.validate"),
])
def test_an_import_file_cannot_change_a_built_in_substrate(tmp_path, capsys, registry, no_data, body, changed):
    """A file that re-registers, removes or patches one of reslm's substrates is refused before anything is
    made, and the registry and classes are put back: a run named esn is always reslm's ESN."""
    from reslm.reservoir import ESN, ESNConfig
    before, forward, validate = dict(registry), ESN.forward, ESNConfig.validate
    user = tmp_path / "evil.py"
    user.write_text(f"from reslm.reservoir import RESERVOIRS, ESN, ESNConfig\n{body}\n")
    assert main(bench_argv(tmp_path, user, reservoir="esn")) == 2
    line = one_error(capsys)
    assert str(user) in line and "changes reslm's own substrate" in line and changed in line
    assert registry == before and ESN.forward is forward and ESNConfig.validate is validate
    assert not (tmp_path / "out").exists()


def test_a_reservoir_from_a_file_is_named_by_its_name_and_the_files_hash(tmp_path, registry):
    """The same substrate as a built-in, registered from a file under a name of its own, gets a configuration
    (and so a fingerprint and folder name) of its own, which carries the file's sha256."""
    from reslm.frontier import bench as fbench
    user = tmp_path / "mine.py"
    user.write_text('from reslm.reservoir import RESERVOIRS\nRESERVOIRS["leaky2"] = RESERVOIRS["leaky"]\n')
    (source,) = fbench._import([str(user)])
    sha = hashlib.sha256(user.read_bytes()).hexdigest()
    assert source["names"] == ["leaky2"] and source["sha256"] == sha
    base = fbench.recipe_config("esn-lr", tmp_path / "results")
    theirs, _, _ = fbench.bench_config(fbench.source_name("leaky2", sha), base, label="leaky2-quick")
    ours, _, _ = fbench.bench_config("leaky", base)
    assert theirs.model["reservoir"] == f"leaky2@{sha[:12]}" and theirs.fingerprint != ours.fingerprint
    assert theirs.name(0) != ours.name(0) and "leaky2" in theirs.name(0)
    user.write_text(user.read_text() + "# edited\n")   # another file: another configuration
    (again,) = fbench._import([str(user)])
    edited, _, _ = fbench.bench_config(fbench.source_name("leaky2", again["sha256"]), base, label="leaky2-quick")
    assert edited.fingerprint != theirs.fingerprint


# --- 72.3: --import answers in one line -----------------------------------------------------------------------
@pytest.mark.parametrize("name, body, message", [
    ("exit0.py", "import sys\nsys.exit(0)\n", "exited (sys.exit(0))"),
    ("exit3.py", "import sys\nsys.exit(3)\n", "exited (sys.exit(3))"),
    ("boom.py", "raise RuntimeError('boom')\n", "failed: RuntimeError: boom"),
    ("syntax.py", "def (:\n", "failed: SyntaxError"),
    ("nothing.py", "x = 1\n", "registered no reservoir"),
    ("ring.txt", "from reslm.reservoir import RESERVOIRS\nRESERVOIRS['ring'] = RESERVOIRS['esn']\n",
     "not a Python file (.py)"),
    ("folder.py", None, "is a folder"),
    ("missing.py", False, "no such file"),
])
def test_a_bad_import_file_is_one_line_naming_it(tmp_path, capsys, registry, no_data, name, body, message):
    before = dict(registry)
    user = tmp_path / name
    if body is None:
        user.mkdir()
    elif body:
        user.write_text(body)
    assert main(bench_argv(tmp_path, user)) == 2
    line = one_error(capsys)
    assert str(user) in line and message in line, line
    assert registry == before and not (tmp_path / "out").exists()


# --- 72.4: the budget, memory and the plan's fields checked before anything is built --------------------------
def test_a_reservoir_too_large_for_memory_is_refused_by_the_bench_before_anything_is_made(
        tmp_path, capsys, monkeypatch, no_data):
    """`bench --size 100000` fits the trainable budget (a 1-wide head) but not memory: one line naming --size,
    counted on a shape-only model, before any folder or matrix."""
    import reslm.core.device as device
    monkeypatch.setattr(device, "memory_limit", lambda: 8 * 2**30)   # the one rule's (check_memory)
    assert main(bench_argv(tmp_path, reservoir="esn") + ["--size", "100000"]) == 2
    line = one_error(capsys)
    assert "reservoir size 100,000" in line and "GiB" in line and "--size" in line
    assert not (tmp_path / "out").exists()


def test_a_reservoir_too_large_for_memory_is_refused_by_train_before_anything_is_made(tmp_path, chars):
    """The same through `reslm train` (the path plans take), in a process held to 8 GiB of address space: one
    line and exit 2 instead of the allocator's error, and no run folder."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))
    out = tmp_path / "big"
    p = subprocess.run([sys.executable, "-m", "reslm.cli", "train", "--family", "rc", "--size", "100000", "--head",
                        "mlp", "--head-hidden", "1", "--data", chars.path.name, "--root", str(chars.path.parent),
                        "--out", str(out), "--no-progress"], capture_output=True, text=True, preexec_fn=limit,
                       timeout=300)
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(err) == 1 and "--size" in err[0] and "GiB" in err[0], p.stderr
    assert not out.exists()


@pytest.mark.parametrize("rule, message", [
    ("seeds = 5", "[rule] seeds must be a list of seeds"),
    ("seeds = [0, 1, 'x']", "[rule] seeds must be distinct integers"),
    ("seeds = [0, true]", "[rule] seeds must be distinct integers"),
    ("seeds = [0, 99999999999999999999]", "[rule] seeds must be distinct integers"),   # past 64 bits
    ("finalists = true", "[rule] finalists must be an integer from 1"),
    ("finalists = 0", "[rule] finalists must be an integer from 1"),
    ("finalists = 2.5", "[rule] finalists must be an integer from 1"),
    ("screen_seed = 'a'", "[rule] screen_seed must be an integer"),
    ("strict = 'yes'", "[rule] strict must be true or false"),
    ("budget = -1", "[rule] budget must be an integer"),
    ("select = 3", "[rule] select must be one of"),
])
def test_a_plans_rule_is_typed_and_bounded(tmp_path, capsys, rule, message):
    path = tmp_path / "bad.toml"
    path.write_text(f"[base]\nlabel = 'b'\nfamily = 'rc'\ntrain = {{ val_fraction = 0.2 }}\n[rule]\n{rule}\n")
    assert main(["frontier", "run", str(path), "--commands", "--results", str(tmp_path / "r")]) == 2
    line = one_error(capsys)
    assert str(path) in line and message in line, line


def test_a_plan_with_too_many_seeds_is_refused_before_any_run(tmp_path, capsys):
    path = tmp_path / "many.toml"
    path.write_text("[base]\nlabel = 'b'\nfamily = 'rc'\n[rule]\nselect = 'none'\nseeds = ["
                    + ", ".join(map(str, range(100_000))) + "]\n")
    assert main(["frontier", "run", str(path), "--results", str(tmp_path / "r"), "--runs", str(tmp_path / "u")]) == 2
    line = one_error(capsys)
    assert str(path) in line and "100,000 seeds" in line and "at most 100" in line
    assert not (tmp_path / "r").exists() and not (tmp_path / "u").exists()


@pytest.mark.parametrize("table, message", [
    ("[base]\nlabel = 'b'\nfamily = 'rc'\nfull = { cycles = 'two' }\n", "[base] full: cycles must be of type int"),
    ("[base]\nlabel = 'b'\nfamily = 'rc'\nfull = { cycles = 0 }\n", "[base] full: cycles must be > 0"),
    ("[base]\nlabel = 'b'\nfamily = 'rc'\nfull = { epochs_per_shard = 100000000 }\n",
     "[base] full: epochs_per_shard must be at most 10,000"),
    ("[base]\nlabel = 'b'\nfamily = 'rc'\ntrain = { cycles = 1000000 }\n", "[base] cycles must be at most 10,000"),
    ("[base]\nlabel = 'b'\npreset = ['rc-750']\n", "[base] preset must be a string"),
    ("[base]\nlabel = 7\nfamily = 'rc'\n", "[base] label must be a string"),
    ("[plan]\nabout = 3\n[base]\nfamily = 'rc'\n", "[plan] about must be a string"),
    ("[base]\nlabel = 'b'\nfamily = 'rc'\n[[candidate]]\nlabel = 'c'\nfull = { cycles = 'x' }\n",
     "[candidate 1] full: cycles must be of type int"),
])
def test_a_plans_tables_are_typed_naming_the_file_and_table(tmp_path, capsys, table, message):
    path = tmp_path / "bad.toml"
    path.write_text(table + "[rule]\nselect = 'none'\n")
    assert main(["frontier", "run", str(path), "--commands", "--results", str(tmp_path / "r")]) == 2
    line = one_error(capsys)
    assert str(path) in line and message in line, line


def test_a_plan_that_is_not_a_readable_text_file_is_named(tmp_path, capsys):
    """A non-UTF-8 byte, a folder and a FIFO: each refused as what it is, naming the plan (a FIFO is not opened)."""
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"[plan]\nabout = 'caf\xe9'\n[base]\nfamily = 'rc'\n")
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path, words in ((latin, "not UTF-8 text (byte 0xe9"), (folder, "is a folder"),
                        (fifo, "not a regular file (a FIFO")):
        assert main(["frontier", "status", str(path), "--results", str(tmp_path)]) == 2
        line = one_error(capsys)
        assert str(path) in line and words in line, line
