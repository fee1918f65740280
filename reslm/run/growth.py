"""How much each commit adds to the results registry's git history (`reslm publish --check-growth`).

A user's clone carries every blob ever committed under results/, so a checkpoint.pt or a weights file
committed again at every shard-epoch of an unfinished run stays in everyone's clone for good. This
module measures, for each commit after a baseline, the bytes of the blobs it adds or changes under
results/ (`git log --raw` for the blobs, one `git cat-file --batch-check` for their sizes: two git
processes for the whole history), and names the commits that add more than LIMIT_MB.

What is counted: a commit's new blobs under results/ (files added or changed; a deleted file adds
nothing), each blob once (one already added by an earlier commit of the walk is not new), at its size
uncompressed (git's packs compress, but weights and optimizer state hardly shrink; the figure does not
depend on how the repository was packed). A merge adds nothing of its own (its blobs are counted in the
commits it merges). A shallow clone's boundary commits are skipped: their parents are not there, so
what they add cannot be told from what they keep.

The history before the baseline (results/.growth-baseline: one commit) already holds large commits and
cannot be rewritten; the check covers the commits after it. A commit meant to be large (one large finished
run, alone) is let through by moving the baseline to it, in a commit that says why.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from reslm.core.errors import ReslmError

# one run per commit stays under it (the largest row of this round, an unfinished rc-750: 0.6 MB of weights and a
# 2.5 MB checkpoint; tf-256-16-16: 0.6 + 1.4 MB): more is several runs published again, or files that are no run's
LIMIT_MB = 5.0
MB = 10**6                      # bytes: the sizes printed and the limit are in MB of 10^6 bytes
UNDER = "results/"              # the registry's folder, from the repository's root
BASELINE = "results/.growth-baseline"
LARGEST = 3                     # files named in an offending commit's line
_EMPTY = "0" * 40


@dataclass(frozen=True)
class Growth:
    """One commit's new blobs under results/: bytes in all, bytes of files it rewrote (already in git at
    that path: a run published again), and its files, largest first."""
    sha: str
    short: str
    subject: str
    added: int
    rewritten: int
    files: tuple[tuple[str, int], ...]

    def over(self, limit_mb: float) -> bool:
        return self.added > limit_mb * MB

    def line(self, limit_mb: float) -> str:
        """`SHORT SUBJECT: X MB added under results/ ...` (the largest files named when over the limit)."""
        subject = self.subject if len(self.subject) <= 72 else self.subject[:69] + "..."
        text = f"{self.short} {subject}: {self.added / MB:.2f} MB added under {UNDER}"
        if self.rewritten >= MB // 100:   # shown to 0.01 MB
            text += f" ({self.rewritten / MB:.2f} MB of it rewriting files already committed)"
        if self.over(limit_mb):
            largest = ", ".join(f"{path} {size / MB:.2f} MB" for path, size in self.files[:LARGEST])
            text += f", over the {limit_mb:g} MB limit; largest: {largest}"
        return text


def _git(root: Path, *args: str, stdin: bytes | None = None) -> bytes:
    try:
        r = subprocess.run(["git", "-C", str(root), *args], input=stdin, capture_output=True)
    except FileNotFoundError:
        raise ReslmError("git is not installed: the growth of results/ is read from git's history") from None
    if r.returncode:
        msg = r.stderr.decode(errors="replace").strip().splitlines()
        raise ReslmError(f"git {args[0]} failed in {root}: {msg[-1] if msg else f'exit status {r.returncode}'}")
    return r.stdout


def repository_root(path: Path) -> Path:
    """The root of the git work tree that holds `path` (ReslmError where there is none)."""
    path = Path(path)
    if not path.is_dir():
        raise ReslmError(f"{path}: no such folder")
    r = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True) \
        if shutil.which("git") else None
    if r is None or r.returncode:
        raise ReslmError(f"{path} is not inside a git clone (an sdist, or git missing): there is no history to measure")
    return Path(r.stdout.strip())


def read_baseline(root: Path) -> str:
    """The baseline commit recorded in ROOT/results/.growth-baseline: its first word that is not a comment."""
    path = Path(root) / BASELINE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ReslmError(f"{path}: no such file (it records the commit the growth check starts after; "
                         "or give --since REV)") from None
    words = [ln.split()[0] for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if not words:
        raise ReslmError(f"{path} names no commit")
    return words[0]


def _commit(root: Path, rev: str) -> str:
    r = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", "--end-of-options",
                        f"{rev}^{{commit}}"], capture_output=True, text=True)
    if r.returncode:
        shallow = _git(root, "rev-parse", "--is-shallow-repository").decode().strip() == "true"
        raise ReslmError(f"{rev}: no such commit in {root}" + (" (a shallow clone: `git fetch --unshallow`, or "
                                                               "--since a commit it has)" if shallow else ""))
    return r.stdout.strip()


def _entries(rest: bytes) -> list[tuple[str, str, str]]:
    """`--raw -z` records (`:MODE MODE OLD NEW STATUS\\0PATH\\0`) as (new blob, status, path)."""
    tokens, out, i = rest.split(b"\0"), [], 0
    while i < len(tokens):
        meta = tokens[i].lstrip(b"\n")
        if meta.startswith(b":") and i + 1 < len(tokens):
            _, new_mode, _, new, status = meta[1:].decode().split()[:5]
            if new_mode != "160000" and new != _EMPTY and not status.startswith("D"):   # no submodules, deletions
                out.append((new, status[0], tokens[i + 1].decode("utf-8", errors="replace")))
            i += 2
        else:
            i += 1
    return out


def _sizes(root: Path, blobs: set[str]) -> dict[str, int]:
    if not blobs:
        return {}
    out = _git(root, "cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize)",
               stdin="".join(f"{b}\n" for b in sorted(blobs)).encode())
    sizes = {}
    for line in out.decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "blob":   # a blob a partial clone lacks reads "SHA missing": not counted
            sizes[parts[0]] = int(parts[2])
    return sizes


def measure(root: Path, since: str, until: str = "HEAD", under: str = UNDER) -> list[Growth]:
    """Each commit in since..until (oldest first) that adds or changes a file under `under`, with the bytes of
    the blobs it adds there. Two git processes, whatever the length of the history."""
    root = Path(root)
    base, head = _commit(root, since), _commit(root, until)
    if subprocess.run(["git", "-C", str(root), "merge-base", "--is-ancestor", base, head],
                      capture_output=True).returncode:
        raise ReslmError(f"{since} ({base[:7]}) is not an ancestor of {until}: the baseline must be a commit of this "
                         "history (see results/.growth-baseline)")
    shallow_file = Path(_git(root, "rev-parse", "--git-path", "shallow").decode().strip())
    shallow_file = shallow_file if shallow_file.is_absolute() else root / shallow_file
    boundary = set(shallow_file.read_text().split()) if shallow_file.is_file() else set()
    log = _git(root, "log", "--reverse", "--full-history", "--no-renames", "--no-color", "--no-show-signature",
               "--raw", "--no-abbrev", "-z", "--format=%x01%H%x02%s", f"{base}..{head}", "--", under)
    commits = []
    for chunk in log.split(b"\x01")[1:]:
        head_line, _, rest = chunk.partition(b"\0")
        sha, subject = head_line.decode("utf-8", errors="replace").split("\x02", 1)
        if sha in boundary:   # a shallow clone's edge: its parents are not here
            continue
        entries = _entries(rest)
        if entries:   # a merge, or a commit that only deletes, adds nothing of its own: left out
            commits.append((sha, subject.strip(), entries))
    sizes = _sizes(root, {blob for *_, entries in commits for blob, _, _ in entries})
    seen: set[str] = set()
    out = []
    for sha, subject, entries in commits:
        files, rewritten = [], 0
        for blob, status, path in entries:
            if blob in seen or blob not in sizes:
                continue
            seen.add(blob)
            files.append((path, sizes[blob]))
            rewritten += sizes[blob] if status == "M" else 0
        files.sort(key=lambda f: (-f[1], f[0]))
        out.append(Growth(sha, sha[:7], subject, sum(s for _, s in files), rewritten, tuple(files)))
    return out


def check(root: Path, since: str | None = None, limit_mb: float = LIMIT_MB) -> tuple[list[Growth], list[str]]:
    """Every commit after `since` (default: the baseline results/.growth-baseline records) with what it adds
    under results/, and one line per commit that adds more than `limit_mb`."""
    root = repository_root(root)
    rows = measure(root, since or read_baseline(root))
    return rows, [g.line(limit_mb) for g in rows if g.over(limit_mb)]


__all__ = ["BASELINE", "LIMIT_MB", "MB", "UNDER", "Growth", "check", "measure", "read_baseline", "repository_root"]
