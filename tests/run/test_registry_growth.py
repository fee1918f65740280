"""The results registry's git history stays small (reslm.run.growth, `reslm publish --check-growth`): no commit
after the baseline results/.growth-baseline records adds more than LIMIT_MB under results/. The measure is
tested on tiny repositories made here ("large" is a lowered limit, never a large file); the last test runs the
check over this repository's own history where the tests run inside a git clone."""
import shutil
import subprocess
from pathlib import Path

import pytest

from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.run import growth

ROOT = Path(__file__).resolve().parents[2]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture
def plain_git(monkeypatch, tmp_path):
    """git as it comes for the repositories made here: no user's or system's configuration (signing, hooks),
    a fixed author. (This repository's own history is read with the user's git, safe.directory and all.)"""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "t")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "t@example.invalid")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, subject: str, files: dict[str, bytes | None]) -> str:
    """Write (bytes) or delete (None) the files, commit them all, return the commit's sha."""
    for name, data in files.items():
        path = repo / name
        if data is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", subject)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path, plain_git):
    """A repository whose first commit is the baseline (results/old, 9,000 bytes: history, never counted) and
    whose second records it in results/.growth-baseline."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    base = commit(r, "before the baseline", {"results/old/weights.safetensors": b"o" * 9000, "README.md": b"x"})
    commit(r, "baseline file", {growth.BASELINE: f"{base}\n# the commits after it are checked\n".encode()})
    return r, base


@needs_git
def test_a_commit_counts_the_files_it_adds_or_changes_under_results_only(repo):
    r, base = repo
    sha = commit(r, "publish a", {"results/a/weights.safetensors": b"w" * 3000, "results/a/metrics.jsonl": b"m" * 100,
                                  "docs/big.md": b"d" * 50_000})   # outside results/: not counted
    rows = growth.measure(r, base)
    assert [g.subject for g in rows] == ["baseline file", "publish a"]
    g = rows[1]
    assert (g.sha, g.short, g.added, g.rewritten) == (sha, sha[:7], 3100, 0)
    assert g.files == (("results/a/weights.safetensors", 3000), ("results/a/metrics.jsonl", 100))   # largest first


@needs_git
def test_rewrites_count_and_unchanged_deleted_or_already_seen_files_do_not(repo):
    r, base = repo
    commit(r, "a", {"results/a/weights.safetensors": b"1" * 2000, "results/a/config.json": b"{}"})
    commit(r, "a again", {"results/a/weights.safetensors": b"2" * 2000})                 # rewritten: counted
    commit(r, "a back", {"results/a/weights.safetensors": b"1" * 2000})                  # that blob is not new
    commit(r, "copies", {"results/b/weights.safetensors": b"3" * 500, "results/c/weights.safetensors": b"3" * 500})
    commit(r, "drop b", {"results/b/weights.safetensors": None})                         # a deletion adds nothing
    rows = {g.subject: g for g in growth.measure(r, base)}
    assert rows["a"].added == 2002 and rows["a"].rewritten == 0
    assert rows["a again"].added == rows["a again"].rewritten == 2000
    assert rows["a back"].added == 0 and rows["a back"].files == ()
    assert rows["copies"].added == 500   # one blob at two paths: stored once
    assert "drop b" not in rows


@needs_git
def test_the_check_names_each_commit_over_the_limit_with_its_largest_files(repo):
    r, base = repo
    commit(r, "small", {"results/s/weights.safetensors": b"s" * 1000})
    big = commit(r, "re-published three unfinished rows", {f"results/r{i}/checkpoint.pt": bytes([65 + i]) * (4000 - i)
                                                           for i in range(4)})
    rows, problems = growth.check(r, limit_mb=0.005)   # 5,000 bytes: the baseline from results/.growth-baseline
    assert [g.subject for g in rows] == ["baseline file", "small", "re-published three unfinished rows"]
    assert problems == [f"{big[:7]} re-published three unfinished rows: 0.02 MB added under results/, over the "
                        "0.005 MB limit; largest: results/r0/checkpoint.pt 0.00 MB, results/r1/checkpoint.pt 0.00 MB, "
                        "results/r2/checkpoint.pt 0.00 MB"]
    assert growth.check(r, limit_mb=growth.LIMIT_MB)[1] == []
    assert growth.check(r, since=big, limit_mb=0.005) == ([], [])   # nothing after it
    # the commit before the baseline (9,000 bytes) is history: never counted
    assert all(g.subject != "before the baseline" for g in rows)


@needs_git
def test_the_command_prints_every_commit_and_exits_2_when_one_is_over(repo, monkeypatch, capsys):
    r, base = repo
    commit(r, "small", {"results/s/weights.safetensors": b"s" * 1000})
    big = commit(r, "big", {"results/b/weights.safetensors": b"b" * 30_000})
    monkeypatch.chdir(r / "results")   # anywhere inside the clone
    assert main(["publish", "--check-growth"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[2] == f"{big[:7]} big: 0.03 MB added under results/"
    assert "3 commit(s) after" in err and "0.03 MB under results/" in err and "0 over the 5 MB limit" in err
    assert main(["publish", "--check-growth", "--limit", "0.01"]) == 2
    out, err = capsys.readouterr()
    assert "over the 0.01 MB limit; largest: results/b/weights.safetensors 0.03 MB" in out.splitlines()[2]
    assert err.splitlines()[-1] == f"reslm: error: 1 commit(s) add more than 0.01 MB under results/: {big[:7]}"
    assert main(["publish", "--check-growth", "--since", big]) == 0


@needs_git
@pytest.mark.parametrize("argv, words", [
    (["publish", "--check-growth", "--since", "nosuch"], "nosuch: no such commit"),
    (["publish", "--check-growth", "runs/x"], "--check-growth publishes nothing"),
    (["publish", "--limit", "3"], "--since and --limit go with --check-growth"),
    (["publish"], "give the run directory to publish (RUN_DIR), or --check-growth"),
])
def test_the_commands_mistakes_are_one_line(repo, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(repo[0])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("reslm: error: ") and words in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("limit", ["0", "-1", "nan", "x"])
def test_a_limit_that_is_not_a_positive_number_is_refused(limit, capsys):
    assert main(["publish", "--check-growth", "--limit", limit]) == 2
    assert "argument --limit" in capsys.readouterr().err


@needs_git
def test_no_history_a_missing_baseline_or_one_of_another_history_is_a_one_line_error(repo, tmp_path):
    r, base = repo
    plain = tmp_path / "sdist"
    plain.mkdir()
    with pytest.raises(ReslmError, match="not inside a git clone"):
        growth.check(plain)
    (r / growth.BASELINE).unlink()
    with pytest.raises(ReslmError, match="growth-baseline: no such file"):
        growth.check(r)
    side = tmp_path / "side"
    side.mkdir()
    git(side, "init", "-q")
    other = commit(side, "another history", {"results/x": b"x"})
    git(r, "fetch", "-q", str(side), "HEAD")   # the commit is there, but not behind HEAD
    with pytest.raises(ReslmError, match="is not an ancestor of HEAD"):
        growth.measure(r, other)


@needs_git
def test_a_shallow_clone_says_the_baseline_is_not_there(repo, tmp_path):
    r, base = repo
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", r.as_uri(), str(clone)], check=True, capture_output=True)
    with pytest.raises(ReslmError, match="a shallow clone"):
        growth.check(clone)


def _history_reason() -> str | None:
    """Why this repository's own history cannot be checked here, or None."""
    if shutil.which("git") is None:
        return "git is not installed"
    if not (ROOT / ".git").exists():
        return f"{ROOT} is not a git clone (an sdist): no history to check"
    if not (ROOT / growth.BASELINE).is_file():
        return f"{growth.BASELINE} is not there"
    base = growth.read_baseline(ROOT)
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{base}^{{commit}}"], capture_output=True).returncode:
        return f"the baseline {base[:7]} is not in this clone (a shallow clone)"
    return None


def test_no_commit_of_this_repository_after_the_baseline_adds_more_than_the_limit_under_results():
    """One commit adds at most LIMIT_MB under results/ (every version of a file committed there is in every
    clone for good): publish an unfinished run once when work on it pauses, not after every shard-epoch."""
    reason = _history_reason()
    if reason:
        pytest.skip(reason)
    _, problems = growth.check(ROOT)
    assert not problems, (f"commits after {growth.BASELINE}'s baseline add more than {growth.LIMIT_MB:g} MB under "
                          "results/ (docs/registry.md, \"Keeping the history small\"):\n" + "\n".join(problems))
