"""How `reslm frontier bench` trains its seeds at once (issue 71, item 3): by default one process per core, each
with its share of the threads counted when it starts; a seed that would start with fewer threads than it gets
once the running ones end waits for them while they should end about then (the last seed trains on every core);
a seed that ran out of memory beside the others goes again alone with every core; any other failure lets the
others finish, starts nothing more, and is raised. The processes and the clock are stand-ins: nothing trains."""
import pytest

from reslm.core.errors import ReslmError
from reslm.frontier import bench as fbench


@pytest.fixture
def spawned(monkeypatch):
    """Stand-in processes on a stand-in clock (one tick per poll): `plan[seed]` lists (exit code, ticks it runs)
    per start (default (0, 10)); returns the starts made, each (seed, threads, seeds running beside it, tick),
    and the plan."""
    starts, live, plan, now = [], {}, {}, [0]

    class Proc:
        def __init__(self, code, ticks):
            self.code, self.end, self.returncode = code, now[0] + ticks, None

        def poll(self):
            if self.returncode is None and now[0] >= self.end:
                self.returncode = self.code
            return self.returncode

    def spawn(run_dir, threads, imports):
        seed = int(str(run_dir))
        starts.append((seed, threads, sorted(s for s, p in live.items() if p.poll() is None), now[0]))
        live[seed] = proc = Proc(*(plan[seed].pop(0) if plan.get(seed) else (0, 10)))
        return proc

    def sleep(seconds):
        now[0] += 1

    monkeypatch.setattr(fbench, "_spawn", spawn)
    monkeypatch.setattr(fbench, "usable_cores", lambda: 2)
    monkeypatch.setattr(fbench.time, "sleep", sleep)
    return starts, plan, lambda: now[0]


def run(spawned, seeds, threads=None, jobs=2):
    starts, plan, clock = spawned
    fbench._parallel(seeds, {s: s for s in seeds}, jobs, threads, [], poll=0, clock=clock)
    return starts


def test_the_last_seed_waits_a_moment_for_every_core(spawned):
    spawned[1][1] = [(0, 11)]   # seed 1 ends a tick after seed 0
    assert run(spawned, [0, 1, 2]) == [(0, 1, [], 0), (1, 1, [0], 0), (2, 2, [], 11)]


def test_the_last_seed_does_not_wait_for_a_seed_far_behind(spawned):
    spawned[1][1] = [(0, 40)]   # seed 1 is far slower than seed 0 took: seed 2 waits a quarter of that, then goes
    assert run(spawned, [0, 1, 2]) == [(0, 1, [], 0), (1, 1, [0], 0), (2, 1, [1], 13)]


def test_given_threads_are_kept_for_every_seed_and_nothing_waits(spawned):
    spawned[1][1] = [(0, 11)]
    assert [(s, t, at) for s, t, _, at in run(spawned, [0, 1, 2], threads=1)] == [(0, 1, 0), (1, 1, 0), (2, 1, 10)]


def test_a_seed_out_of_memory_beside_another_goes_again_alone_with_every_core(spawned):
    spawned[1][0] = [(75, 1), (0, 10)]   # out of memory beside seed 1, then fine alone
    assert run(spawned, [0, 1]) == [(0, 1, [], 0), (1, 1, [0], 0), (0, 2, [], 10)]


def test_another_failure_lets_the_others_finish_and_is_raised(spawned):
    spawned[1][0] = [(2, 1)]
    with pytest.raises(ReslmError, match="seed 0's training process exited with status 2"):
        run(spawned, [0, 1, 2])
    assert [s for s, *_ in spawned[0]] == [0, 1]   # seed 2 never started


def test_the_default_is_one_job_per_core_and_no_more_than_the_seeds_left(spawned, monkeypatch):
    starts = spawned[0]
    monkeypatch.setattr(fbench, "is_finished", lambda d: d == 0)
    assert fbench._train_seeds({s: s for s in range(3)}, None, None, [], False, poll=0) == 2
    assert [s for s, *_ in starts] == [1, 2]
    trained = []
    monkeypatch.setattr(fbench, "train", lambda d, progress: trained.append(d))
    monkeypatch.setattr(fbench, "is_finished", lambda d: d != 2)
    assert fbench._train_seeds({s: s for s in range(3)}, None, None, [], False, poll=0) == 1
    assert trained == [2]   # one seed left: trained here, with every core
