"""The sixth fault probe (issue 89), the bench's part: a stopped `reslm frontier bench` ends cleanly (one line
saying what finished and what did not, no table row, memory profile or card of an unfinished run, no temp
file, the stop's exit status); every size it takes is counted before anything is made (the streams with the
weights and the states; `reslm memory`'s windows), by one rule (exit 2 when it can never fit this machine, 75
when not now, one line of reslm's own); a field given twice in `--set`, or one the chosen reservoir does not
use, is refused in one line. A tiny recipe on the tiny corpus made in the test (tests/conftest.py `chars`)."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from reslm import train as tt
from reslm.cli import _interrupt, main
from reslm.core import device, stop
from reslm.core.errors import ReslmError, Stopped
from reslm.frontier import bench as fbench
from reslm.frontier import load_plan
from reslm.train import loop

RECIPE = """
[plan]
about = "a tiny recipe for the bench"

[base]
label = "tiny-recipe"
family = "rc"
data = "tiny"
model = { size = 30, streams = 8 }
train = { batch_size = 64, epochs_per_shard = 1, epoch_samples = 128, lr = 3e-3, val_fraction = 0.2, eval_samples = 100 }

[rule]
seeds = [0]
"""


@pytest.fixture
def recipe(tmp_path, chars, monkeypatch):
    """The bench's recipe replaced by RECIPE's base; returns the path of the plan file."""
    plan = tmp_path / "tiny-recipe.toml"
    plan.write_text(textwrap.dedent(RECIPE))
    monkeypatch.setattr(fbench, "recipe_config", lambda *a, **k: load_plan(plan).base)
    monkeypatch.chdir(tmp_path)
    return plan


def bench_argv(tmp_path, chars, *extra, reservoir="esn", seeds="0,1", out="out", positions="0"):
    return ["frontier", "bench", "--reservoir", reservoir, "--seeds", seeds, "--out", str(tmp_path / out),
            "--results", str(tmp_path / "results"), "--root", str(chars.path.parent), "--no-progress",
            "--memory-positions", positions, *extra]


def errors(text: str) -> list[str]:
    """The `reslm: error:` lines of a stderr; none of it a traceback."""
    assert "Traceback" not in text, text
    return [line for line in text.splitlines() if line.startswith("reslm: error:")]


def temp_files(folder: Path) -> list[Path]:
    """What a stop could leave behind: temp files and folders (atomic writes' `.NAME.XXXX.tmp`, a new run
    folder's `.NAME.tmp-XXXXXXXX`); a run's `.lock` is its lock file, kept by design."""
    return [p for p in folder.rglob("*") if ".tmp" in p.name or (p.name.startswith(".") and p.name != ".lock")]


def nothing_for_the_call(out: Path) -> None:
    """No card, no memory profile (its JSON and figure), no temp file."""
    assert not (out / fbench.CARD).exists() and not (out / "memory.json").exists() and not (out / "memory.png").exists()
    assert temp_files(out) == []


def step_then(monkeypatch, at: int, then) -> tuple[list[int], object]:
    """The training step (reslm.train.loop._train_step) calling `then()` before its `at`-th call; returns the
    steps seen and the real step."""
    real, calls = loop._train_step, []

    def step(t):
        calls.append(t.step)
        if len(calls) == at:
            then()
        return real(t)
    monkeypatch.setattr(loop, "_train_step", step)
    return calls, real


# --- 89.3: a stopped bench ends cleanly --------------------------------------------------------------------
def test_a_sigterm_stops_the_bench_in_one_line_with_no_card_and_the_stops_status(recipe, tmp_path, chars, capsys,
                                                                              monkeypatch):
    """SIGTERM while seed 0 trains (the handler main() installs, as `kill PID` calls it): seed 0 stops at the end
    of its step with its checkpoint, seed 1 does not start, and the bench says so in one line, writes no table,
    memory profile or card, leaves no temp file and exits 143 (128 + SIGTERM). The same command then
    continues and writes the card."""
    steps, real = step_then(monkeypatch, 3, lambda: _interrupt(signal.SIGTERM, None))
    argv = bench_argv(tmp_path, chars, "--jobs", "1", positions="50")   # the seeds trained here, one by one
    assert main(argv) == 143
    captured = capsys.readouterr()
    line, = errors(captured.err)
    assert "reslm: asked to stop (SIGTERM)" in captured.err and not captured.out.strip()   # no table
    assert re.search(r"frontier bench asked to stop \(SIGTERM\): seed 0 stopped at step \d+; seed 1 not started; "
                     r"no table, memory profile or card written", line), line
    assert len(steps) == 3 and not stop.requested()
    out = tmp_path / "out"
    nothing_for_the_call(out)
    assert len([d for d in out.iterdir() if d.is_dir()]) == 2 and (next(out.glob("*-s0")) / "checkpoint.pt").exists()
    monkeypatch.setattr(loop, "_train_step", real)
    assert main(argv) == 0
    assert (out / fbench.CARD).exists() and (out / "memory.json").exists()
    assert "not measured" not in capsys.readouterr().out


def test_a_bench_called_with_the_stop_asked_writes_no_card_and_raises_the_stop(recipe, tmp_path, chars):
    """Called as a function with reslm's stop flag set: no seed starts, no table, profile or card (today's card
    gave an unfinished run's memory profile beside "not measured"), and Stopped with the stop's status."""
    out = tmp_path / "out"
    try:
        with stop.graceful():
            assert stop.request()
            with pytest.raises(Stopped) as e:
                fbench.bench("esn", seeds=(0,), out=out, results=tmp_path / "results", data_root=chars.path.parent,
                             progress=False, memory_positions=50)
    finally:
        stop.clear()
    assert e.value.exit_status == 143 and "seed 0 not started" in str(e.value) and "\n" not in str(e.value)
    nothing_for_the_call(out)


def test_ctrl_c_stops_the_bench_in_one_line_with_the_interrupts_status(recipe, tmp_path, chars, capsys, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) while seed 0 trains: one line naming what stopped and what did not start,
    exit 130 (the CLI's status for an interrupt), no card, no temp file."""
    def interrupt():
        raise KeyboardInterrupt
    step_then(monkeypatch, 3, interrupt)
    assert main(bench_argv(tmp_path, chars, "--jobs", "1", positions="50")) == 130
    line, = errors(capsys.readouterr().err)
    assert re.search(r"frontier bench interrupted: seed 0 stopped.*; seed 1 not started; no table", line), line
    nothing_for_the_call(tmp_path / "out")


CHILD = """\
import sys
from pathlib import Path
from reslm.frontier import bench as fbench, load_plan
from reslm.train import loop
plan, marker = Path(sys.argv[1]), Path(sys.argv[2])
fbench.recipe_config = lambda *a, **k: load_plan(plan).base
real, calls = loop._train_step, []
def step(t):
    calls.append(t.step)
    if len(calls) == 3:
        marker.write_text("at its third step")
        sys.stdin.read()   # until the test closes it, once it has sent its SIGTERM
    return real(t)
loop._train_step = step
from reslm.cli import main
sys.exit(main(sys.argv[3:]))
"""


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 240) -> None:
    """Until the child process has written `path` (or ended: then the test fails with its stderr)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the child never got to its third step"
        time.sleep(0.05)


def test_a_real_sigterm_to_the_command_ends_it_cleanly(recipe, tmp_path, chars):
    """`kill PID` of a `reslm frontier bench` process while its seed trains (the issue's `timeout 40 reslm
    frontier bench ...`): the acknowledgement, then one line, no table and exit 143; no card, no temp file."""
    child, marker = tmp_path / "child.py", tmp_path / "at-step-3"
    child.write_text(CHILD)
    p = subprocess.Popen([sys.executable, str(child), str(recipe), str(marker),
                          *bench_argv(tmp_path, chars, seeds="0", positions="50")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(marker, p)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(input="", timeout=240)   # stdin closed: the step goes on, the loop takes the stop
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err
    line, = errors(err)
    assert "reslm: asked to stop (SIGTERM)" in err and not out.strip()
    assert re.search(r"asked to stop \(SIGTERM\): seed 0 stopped at step \d+; no table", line), line
    nothing_for_the_call(tmp_path / "out")


RING = """\
import os, sys, time
from pathlib import Path
import torch
from reslm.core import stop
from reslm.reservoir import ESN, ESNConfig, RESERVOIRS
from reslm.train import loop

class RingESN(ESN):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.W_T.copy_(cfg.spectral_radius * torch.roll(torch.eye(cfg.size), 1, dims=0))

RESERVOIRS["ring-stop"] = (ESNConfig, RingESN)

if sys.argv[0] == "-c" and len(sys.argv) >= 3:   # a seed's own process (the bench's _train_one: THREADS RUN_DIR FILE.py), not the bench (nor an xdist worker, also "-c")
    marks, seed = Path(os.environ["RING_MARKS"]), sys.argv[2].rsplit("-s", 1)[1]
    real, calls = loop._train_step, []

    def step(t):
        calls.append(t.step)
        if len(calls) == 3:   # both seeds at their third step; seed 0 then stops the bench; both wait for it
            (marks / seed).write_text("")
            deadline = time.monotonic() + 60
            if seed == "0":
                while not all((marks / s).exists() for s in "01") and time.monotonic() < deadline:
                    time.sleep(0.01)
                os.kill(os.getppid(), int(os.environ["RING_SIGNAL"]))
            while not stop.requested() and time.monotonic() < deadline:   # the bench passes its stop on
                time.sleep(0.01)
        return real(t)
    loop._train_step = step
"""


@pytest.mark.parametrize("sig, status, said", [(signal.SIGTERM, 143, "asked to stop (SIGTERM)"),
                                               (signal.SIGINT, 130, "interrupted")])
def test_a_stop_of_a_bench_with_seeds_in_processes_is_passed_on_and_ends_cleanly(
        recipe, tmp_path, chars, capfd, monkeypatch, registry, sig, status, said):
    """`--jobs 2`: each seed in its own process. SIGTERM to the bench (or Ctrl-C, which only the bench gets:
    its seeds run in a process group of their own) is passed on to both seeds, each stops at the end of its
    step with its checkpoint (its process takes the stop as the CLI does, without a traceback), and the
    bench waits for them, then says so in one line with the stop's status: no card, no temp file."""
    user = tmp_path / "ring.py"
    user.write_text(RING)
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv("RING_MARKS", str(tmp_path / "marks"))
    monkeypatch.setenv("RING_SIGNAL", str(int(sig)))
    monkeypatch.setattr(loop, "_train_step", loop._train_step)   # put back after the file patches it here
    real = fbench._train_seeds
    monkeypatch.setattr(fbench, "_train_seeds", lambda *a, **k: real(*a, **k, poll=0.05))   # the bench polls often
    # Ctrl-C as a terminal's foreground command gets it: a shell without job control starts a background
    # command (`make test &`) with SIGINT ignored, and Python then keeps it ignored, as reslm does
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = main(bench_argv(tmp_path, chars, "--import", str(user), "--jobs", "2", reservoir="ring-stop"))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == status
    err = capfd.readouterr().err
    line, = errors(err)
    assert re.search(rf"frontier bench {re.escape(said)}: seed 0 stopped at step \d+, seed 1 stopped at step \d+; "
                     r"no table, memory profile or card written", line), line
    nothing_for_the_call(tmp_path / "out")


def test_the_seeds_processes_get_the_stop_and_none_starts_after_it(monkeypatch):
    """_parallel (stand-in processes): a stop asked while two seeds run is passed on to them (SIGTERM), the
    third never starts, and a seed that ended by the signal is no failure of its own (the stop's line tells)."""
    started, signalled = [], []

    class Proc:
        def __init__(self, seed):
            self.seed, self.returncode = seed, None

        def poll(self):
            if self.returncode is None and self.seed in signalled:
                self.returncode = 0 if self.seed == 0 else -signal.SIGTERM   # seed 1 ended before its handler
            elif self.returncode is None and len(ticks) > 20:   # never asked to stop: it ends on its own
                self.returncode = 0
            return self.returncode

        def send_signal(self, sig):
            assert sig == signal.SIGTERM
            signalled.append(self.seed)

    def spawn(run_dir, threads, imports):
        started.append(run_dir)
        return Proc(run_dir)

    ticks = []

    def sleep(seconds):
        ticks.append(1)
        if len(ticks) == 2:
            assert stop.request()   # the SIGTERM handler's call, while two seeds run

    monkeypatch.setattr(fbench, "_spawn", spawn)
    monkeypatch.setattr(fbench, "usable_cores", lambda: 2)
    monkeypatch.setattr(fbench.time, "sleep", sleep)
    try:
        with stop.graceful():
            fbench._parallel([0, 1, 2], {0: 0, 1: 1, 2: 2}, 2, None, [], poll=0)
    finally:
        stop.clear()
    assert started == [0, 1] and sorted(signalled) == [0, 1]


# --- 89.2: every size counted before anything is made -------------------------------------------------------
@pytest.fixture
def sizes(recipe, chars):
    """(parts at the recipe's 8 streams, parts at 10^12 streams, the dataset): fbench.run_bytes of each."""
    base, ds = load_plan(recipe).base, chars
    parts = []
    for settings in ({}, {"streams": 10**12}):
        cfg, _, spec = fbench.bench_config("esn", base, settings=settings)
        parts.append(fbench.run_bytes(cfg, spec, ds))
    return parts[0], parts[1], ds


def test_the_streams_are_counted_with_the_weights_and_the_states(sizes):
    """A stream per character holds two states or more per character of the text it reads besides the stored
    states (the issue's 10^12 streams on the Shakespeare shards grew past 5.5 GB before any check): the pass's
    buffers grow with the streams, the rest of the count does not."""
    few, many, ds = sizes
    longest = max(b - a for a, b in ds.shards)
    assert many["pass"] > few["pass"] and many["pass"] >= 2 * longest * 30 * 2            # 30 units, bf16 at least
    assert {k: v for k, v in many.items() if k != "pass"} == {k: v for k, v in few.items() if k != "pass"}
    # at the recipe's size on a Shakespeare-sized shard: a hundredth of a GiB at 1,024 streams, GiBs at 10^12
    at = lambda streams: device.reservoir_pass_bytes("stream", 800_000, 750, 16, 32, streams, 32)  # noqa: E731
    assert at(1024) < 0.2 * 2**30 and at(10**12) >= 2 * 800_000 * 750 * 4 > 4 * 2**30


@pytest.mark.parametrize("never, status", [(True, 2), (False, 75)])
def test_streams_that_cannot_fit_are_refused_before_anything_is_made(recipe, sizes, tmp_path, chars, capsys,
                                                                    monkeypatch, never, status):
    """`--set streams=1000000000000`: beyond what this machine can ever hold, exit 2; beyond what is available
    now, exit 75; one line of reslm's own naming the streams, and no folder made, no training started."""
    few, many, _ = sizes
    limit = (sum(few.values()) + sum(many.values())) // 2     # the recipe's 8 streams fit, 10^12 do not
    monkeypatch.setattr(device, "memory_limit", lambda: limit if never else 10**15)
    monkeypatch.setattr(device, "available_memory", lambda d: 10**15 if never else limit)
    monkeypatch.setattr(fbench, "ensure_run", lambda *a, **k: (_ for _ in ()).throw(ReslmError("a folder made")))
    assert main(bench_argv(tmp_path, chars, "--set", "streams=1000000000000")) == status
    line, = errors(capsys.readouterr().err)
    assert "--set streams" in line and "GiB" in line and "a folder made" not in line, line
    assert ("this machine lets reslm hold" in line) == never and ("available now" in line) == (not never)
    assert not (tmp_path / "out").exists()
    assert main(bench_argv(tmp_path, chars)) == 2                     # the recipe's streams: past the check
    assert "a folder made" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_run(chars, tmp_path_factory):
    out = tt.create_run(tmp_path_factory.mktemp("mem") / "rc", "rc", dict(size=24, context=8),
                        dict(batch_size=64, epochs_per_shard=1, epoch_samples=128, lr=3e-3, device="cpu"), chars)
    tt.train(out, progress=False)
    return out


@pytest.mark.parametrize("never, status", [(True, 2), (False, 75)])
def test_a_memory_profile_that_cannot_fit_is_one_line_of_reslms_own(tiny_run, tmp_path, capsys, monkeypatch, never,
                                                                   status):
    """`reslm memory --lengths 1000000` asked 122 GiB of numpy on a 23.5 GiB machine and got numpy's raw message
    and exit 75: the windows are counted first, exit 2 when they can never fit, 75 when not now, in one line
    naming --lengths and --positions; nothing written. (Here 200 windows of 501 symbols against 1 MiB.)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(device, "memory_limit", lambda: 2**20 if never else 10**15)
    monkeypatch.setattr(device, "available_memory", lambda d: 10**15 if never else 2**20)
    argv = ["memory", str(tiny_run), "--lengths", "1,500", "--positions", "200", "--out", "m.json", "--no-progress"]
    assert main(argv) == status
    line, = errors(capsys.readouterr().err)
    assert line.startswith("reslm: error: the memory profile (200 windows of 501 symbols) needs at least 2.3 MiB")
    assert "--lengths" in line and "--positions" in line and "allocate" not in line
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(device, "memory_limit", lambda: 10**15)
    monkeypatch.setattr(device, "available_memory", lambda d: 10**15)
    assert main(argv) == 0 and (tmp_path / "m.json").exists()


def test_reservoir_states_that_can_never_fit_exit_2_not_75(monkeypatch):
    """The training's own state check follows the same rule: states beyond what the machine can ever hold are
    exit 2 (a smaller configuration, not a later try), beyond what is free now 75."""
    import torch
    from reslm.core.errors import OutOfMemory
    monkeypatch.setenv("RESLM_BF16", "1")
    monkeypatch.setattr(device, "memory_limit", lambda: 2 * 2**30)
    monkeypatch.setattr(device, "available_memory", lambda d: 2 * 2**30)
    cpu = torch.device("cpu")
    with pytest.raises(ReslmError, match="more than the 2.0 GiB this machine lets reslm hold") as e:
        device.state_dtypes("bfloat16", cpu, 1000, 900_000, 100_000)          # 2.9 GiB with the process's own
    assert not isinstance(e.value, OutOfMemory)
    monkeypatch.setattr(device, "memory_limit", lambda: 8 * 2**30)
    with pytest.raises(OutOfMemory, match="is available"):
        device.state_dtypes("bfloat16", cpu, 1000, 900_000, 100_000)


# --- 89.5: the minor cases of --set --------------------------------------------------------------------------
@pytest.fixture
def no_data(monkeypatch):
    """The bench stops where it would open its dataset: these tests never get as far as training."""
    monkeypatch.setattr(fbench, "find_dataset", lambda *a, **k: (_ for _ in ()).throw(ReslmError("got past --set")))


def test_a_field_given_twice_in_set_is_refused_naming_it(recipe, tmp_path, chars, capsys, no_data):
    assert main(bench_argv(tmp_path, chars, "--set", "input_scaling=0.5,spectral_radius=0.9,spectral_radius=0.5")) == 2
    line, = errors(capsys.readouterr().err)
    assert "--set spectral_radius is given twice (spectral_radius=0.9 and spectral_radius=0.5)" in line, line
    assert not (tmp_path / "out").exists()


NODE = """\
from reslm.reservoir import RESERVOIRS
from reslm.reservoir.reservoirpy_node import ReservoirpyConfig, ReservoirpyNode

class Node:   # what the adapter reads of a reservoirpy node before it builds one (no reservoirpy needed here)
    units, input_dim = 30, 16
    def _step(self, *a):
        pass

RESERVOIRS["rpy-like"] = (type("rpyConfig", (ReservoirpyConfig,), {"source": Node(), "node_name": "rpy-like"}),
                          ReservoirpyNode)
"""


@pytest.mark.parametrize("reservoir, field", [("rpy-like", "spectral_radius"), ("nvar", "spectral_radius"),
                                              ("diagonal", "leak_rate")])
def test_a_knob_the_reservoir_does_not_use_is_refused_not_put_in_the_runs_name(recipe, tmp_path, chars, capsys,
                                                                               registry, no_data, reservoir, field):
    """`--set spectral_radius=0.5` on a reservoirpy node (whose operating point is the node's own) gave a run of
    another name and the same states: refused in one line naming the field and the substrate's knobs; a knob it
    has goes through."""
    user = tmp_path / "node.py"
    user.write_text(NODE)
    imports = ["--import", str(user)] if reservoir == "rpy-like" else []
    assert main(bench_argv(tmp_path, chars, *imports, "--set", f"{field}=0.5", reservoir=reservoir)) == 2
    line, = errors(capsys.readouterr().err)
    assert f"--set {field}: the {reservoir}" in line and "does not use it" in line, line
    assert not (tmp_path / "out").exists()
    if reservoir != "rpy-like":   # input_scaling is nvar's and diagonal's: past this check
        main(bench_argv(tmp_path, chars, "--set", "input_scaling=0.5", reservoir=reservoir))
        assert "does not use it" not in capsys.readouterr().err
