"""How `reslm frontier bench` trains its seeds at once (issue 71, item 3): by default one process per core, each
with its share of the threads counted when it starts (the last seed, once the others ended, gets every core); a
seed that ran out of memory beside the others goes again alone with every core; any other failure lets the others
finish, starts nothing more, and is raised. The processes are stand-ins: no training runs here."""
import pytest

from reslm.core.errors import ReslmError
from reslm.frontier import bench as fbench


class _Proc:
    """A seed's process that ends after `polls` polls with `code`."""

    def __init__(self, code=0, polls=1):
        self.code, self.polls, self.returncode = code, polls, None

    def poll(self):
        self.polls -= 1
        if self.polls < 0 and self.returncode is None:
            self.returncode = self.code
        return self.returncode


@pytest.fixture
def spawned(monkeypatch):
    """Stand-in processes: `plan[seed]` is a list of (exit code, polls) per start; returns the starts made, each
    (seed, threads, seeds running beside it)."""
    starts, live, plan = [], {}, {}

    def spawn(run_dir, threads, imports):
        seed = int(str(run_dir))
        starts.append((seed, threads, sorted(s for s, p in live.items() if p.returncode is None)))
        code, polls = plan.get(seed, []).pop(0) if plan.get(seed) else (0, 1)
        live[seed] = proc = _Proc(code, polls)
        return proc

    monkeypatch.setattr(fbench, "_spawn", spawn)
    monkeypatch.setattr(fbench, "usable_cores", lambda: 2)
    return starts, plan


def test_three_seeds_on_two_cores_the_last_one_gets_both(spawned):
    starts, _ = spawned
    fbench._parallel([0, 1, 2], {s: s for s in range(3)}, 2, None, [], poll=0)
    assert starts == [(0, 1, []), (1, 1, [0]), (2, 2, [])]


def test_given_threads_are_kept_for_every_seed(spawned):
    starts, _ = spawned
    fbench._parallel([0, 1, 2], {s: s for s in range(3)}, 2, 1, [], poll=0)
    assert [t for _, t, _ in starts] == [1, 1, 1]


def test_a_seed_out_of_memory_beside_another_goes_again_alone_with_every_core(spawned):
    starts, plan = spawned
    plan[0] = [(75, 0), (0, 0)]   # out of memory at once beside seed 1, then fine alone
    plan[1] = [(0, 3)]
    fbench._parallel([0, 1], {s: s for s in range(2)}, 2, None, [], poll=0)
    assert starts == [(0, 1, []), (1, 1, [0]), (0, 2, [])]


def test_another_failure_lets_the_others_finish_and_is_raised(spawned):
    starts, plan = spawned
    plan[0] = [(2, 0)]
    plan[1] = [(0, 3)]
    with pytest.raises(ReslmError, match="seed 0's training process exited with status 2"):
        fbench._parallel([0, 1, 2], {s: s for s in range(3)}, 2, None, [], poll=0)
    assert [s for s, _, _ in starts] == [0, 1]   # seed 2 never started


def test_the_default_is_one_job_per_core_and_no_more_than_the_seeds_left(spawned, monkeypatch, tmp_path):
    starts, _ = spawned
    monkeypatch.setattr(fbench, "is_finished", lambda d: d == 0)
    assert fbench._train_seeds({s: s for s in range(3)}, None, None, [], False, poll=0) == 2
    assert [s for s, _, _ in starts] == [1, 2]
    trained = []
    monkeypatch.setattr(fbench, "train", lambda d, progress: trained.append(d))
    monkeypatch.setattr(fbench, "is_finished", lambda d: d != 2)
    assert fbench._train_seeds({s: s for s in range(3)}, None, None, [], False, poll=0) == 1
    assert trained == [2]   # one seed left: trained here, with every core
