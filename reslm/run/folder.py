"""The run folder's own files: config.json (create, read), metrics.jsonl (append, read, repair), and
the comparison of a folder's run with a requested one. See reslm.run for the folder's layout.

metrics.jsonl is appended and fsynced row by row; a last row cut off by a kill or a full disk is
dropped with a warning on stderr when the log is read again (a damaged row before it is an error).
Resuming needs the metrics rows the checkpoint had seen (MetricsLog.truncate): a short or missing
log is an error, not a silently shorter history. JSON is strict: a NaN or Infinity is refused with
a ReslmError naming the key, before anything is written.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from reslm.core.errors import ReslmError, describe
from reslm.core.files import (atomic_write, fsync_dir, fsync_file, missing_parents, non_finite, open_plain, read_json, read_plain,
                              reason, remove_empty_dirs, strict_dumps)

CONFIG, METRICS, CHECKPOINT, SUMMARY, LOCK = "config.json", "metrics.jsonl", "checkpoint.pt", "summary.json", ".lock"
NAME_MAX = 255  # bytes in one path component (Linux, macOS)


def shown(path) -> str:
    """A path as an error message shows it: repr() when it has unprintable characters, long ones cut."""
    s = str(path)
    if any(not c.isprintable() for c in s):
        s = repr(s)
    return s if len(s) <= 160 else s[:80] + "..." + s[-40:]


# ---------------------------------------------------------------------------------------------------
# config.json

def _check_out_name(out: Path) -> None:
    s = str(out)
    if not s:
        raise ReslmError("the run directory name is empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in s):
        raise ReslmError(f"cannot create run directory {shown(out)}: the name has control characters")
    for part in out.parts:
        try:
            n = len(os.fsencode(part))
        except UnicodeError:
            raise ReslmError(f"cannot create run directory {shown(out)}: the name is not valid text") from None
        if n > NAME_MAX:
            raise ReslmError(f"cannot create run directory {shown(out)}: a name is {n} bytes long "
                             f"(at most {NAME_MAX})")


def _make_parents(out: Path) -> list[Path]:
    """Create out's missing parent folders; return them (innermost first) so a failure can remove them."""
    missing, p = missing_parents(out)
    if not p.is_dir():
        raise ReslmError(f"cannot create run directory {shown(out)}: {shown(p)} is not a directory")
    created: list[Path] = []
    for q in reversed(missing):
        try:
            q.mkdir()
        except OSError as e:
            remove_empty_dirs(created[::-1])
            raise ReslmError(f"cannot create run directory {shown(out)}: {reason(e)}") from None
        created.append(q)
    return created[::-1]


def create_run_dir(out: Path, config: dict) -> Path:
    """Make a new run directory holding config.json. It appears only once config.json is complete (a
    temp folder renamed into place); an existing empty folder (or one holding only .lock: a caller
    may lock it first) gets config.json written into it. A path that cannot work (under a file, in
    /proc, unwritable, a name over 255 bytes or with control characters, an existing non-empty
    folder, a file) raises a one-line ReslmError and creates nothing."""
    out = Path(out)
    _check_out_name(out)
    text = strict_dumps(config, out / CONFIG, indent=2) + "\n"  # a bad config fails before anything is made
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise ReslmError(f"{shown(out)} exists and is not a directory")
        try:
            leftovers = [p for p in out.iterdir() if p.name != LOCK]
        except OSError as e:
            raise ReslmError(f"cannot use {shown(out)} as a run directory: {reason(e)}") from None
        if leftovers:
            raise ReslmError(f"{shown(out)} already exists and is not empty "
                             f"(use --resume to continue a run there)")
        atomic_write(out / CONFIG, lambda p: p.write_text(text))
        return out
    created = _make_parents(out)
    tmp = None
    try:
        try:
            tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name[:40]}.tmp-"))
            (tmp / CONFIG).write_text(text)
            fsync_file(tmp / CONFIG)
        except OSError as e:
            raise ReslmError(f"cannot create run directory {shown(out)}: {reason(e)}") from None
        try:
            os.replace(tmp, out)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise ReslmError(f"{shown(out)} already exists (another process made it just now)") from None
            raise ReslmError(f"cannot create run directory {shown(out)}: {reason(e)}") from None
        tmp = None
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        remove_empty_dirs(created)
        raise
    fsync_dir(out.parent)
    return out


def _config_problem(cfg) -> str | None:
    if not isinstance(cfg, dict):
        return "it must be a JSON object"
    if "family" not in cfg:
        return "'family' is missing"
    if not isinstance(cfg["family"], str) or not cfg["family"]:
        return "'family' must be a non-empty string"
    if cfg.get("preset") is not None and not isinstance(cfg["preset"], str):
        return "'preset' must be a string or null"
    for key in ("model", "train", "data"):
        if key not in cfg:
            return f"{key!r} is missing"
        if not isinstance(cfg[key], dict):
            return f"{key!r} must be an object"
    if not isinstance(cfg["data"].get("path"), str):
        return "'data.path' must be a string"
    for key, kinds, what in (("name", str, "a string"), ("kind", str, "a string"), ("fingerprint", dict, "an object"),
                             ("vocab", list, "a list"), ("vocab_size", int, "an integer"),
                             ("test_shard", int, "an integer"), ("shards", list, "a list")):
        v = cfg["data"].get(key)
        if v is not None and (not isinstance(v, kinds) or isinstance(v, bool)):
            return f"'data.{key}' must be {what}"
    if isinstance(cfg["data"].get("vocab"), list) and not all(isinstance(c, str) for c in cfg["data"]["vocab"]):
        return "'data.vocab' must be a list of strings"
    for part in ("model", "train"):
        bad = next((k for k, v in cfg[part].items() if isinstance(v, (dict, list))), None)
        if bad is not None:
            return f"'{part}.{bad}' must be a number, string, true/false or null"
    return None


def read_config(run_dir: Path) -> dict:
    """config.json of a run, checked: family a string, model/train/data objects, data.path a string.
    Anything else raises ReslmError "RUN/config.json is not a valid run config: 'model' must be an object"."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG
    data = read_plain(path)   # a link or a special file in its place: ReslmError, not followed
    if data is None:
        raise ReslmError(f"{run_dir} is not a reslm run directory (no {CONFIG})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReslmError(f"cannot read {path}: it is not UTF-8 text") from None
    if not text.strip():
        raise ReslmError(f"{path} is not a valid run config: the file is empty")
    try:
        cfg = json.loads(text)
    except ValueError as e:
        raise ReslmError(f"{path} is not a valid run config: not JSON ({describe(e)})") from None
    problem = _config_problem(cfg)
    if problem:
        raise ReslmError(f"{path} is not a valid run config: {problem}")
    return cfg

# ---------------------------------------------------------------------------------------------------
# metrics.jsonl

def _scan_metrics(path: Path, only: tuple[bytes, ...] = ()) -> tuple[list[dict], int | None, bool]:
    """(rows, byte offset of a cut-off last line or None, whether the file lacks its final newline).

    A row is a JSON object on one line; blank lines are skipped, and so, unread, are lines holding none
    of the byte strings `only` where given. A bad last line is reported, not read (a kill or a full disk
    mid-append); a bad line before it raises ReslmError with its number."""
    data = read_plain(path)   # a link or a special file in its place: ReslmError, not followed
    if data is None:
        return [], None, False
    lines = data.split(b"\n")
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    rows, pos = [], 0
    for i, raw in enumerate(lines):
        start, pos = pos, pos + len(raw) + 1
        if not raw.strip() or (only and not any(b in raw for b in only)):
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError is a ValueError
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif i == last:
            return rows, start, False
        else:
            raise ReslmError(f"{path} line {i + 1} is not a JSON row (the file is damaged; "
                             f"remove that line or the run)")
    return rows, None, bool(data) and not data.endswith(b"\n")


def _warn_torn(path: Path) -> None:
    print(f"reslm: warning: dropped a cut-off last line of {path}", file=sys.stderr)


def _finite_or_none(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj


def read_metrics(run_dir: Path, *kinds: str) -> list[dict]:
    """The rows of metrics.jsonl ([] if there is none); with `kinds` ("eval", "weights"), only the rows of
    those kinds, the others skipped unparsed (a log's step rows are most of it). A cut-off last line is
    dropped with a warning on stderr; a damaged line before it (among those read) raises ReslmError naming
    the file and line number."""
    path = Path(run_dir) / METRICS
    rows, torn_at, _ = _scan_metrics(path, tuple(json.dumps(k).encode() for k in kinds))
    if torn_at is not None:
        _warn_torn(path)
    return [r for r in rows if r.get("kind") in kinds] if kinds else rows


class MetricsLog:
    """Append-only JSONL log; `truncate(n)` drops rows written after the checkpoint we resume from (and
    refuses a log shorter than that checkpoint had seen).

    Opening it repairs the file: a cut-off last line is cut away (with read_metrics's warning) so the
    next row starts on a line of its own; `rows` counts the good rows. `write(row)` appends one row,
    flushes and fsyncs it; it raises ReslmError, writing nothing, for a NaN/Infinity value (naming the
    key, and the row's step: "non-finite val_loss=nan at step 3: ...") or a failed write (disk full: the
    partial line is cut away again). Use it under lock_run."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS
        rows, torn_at, no_newline = _scan_metrics(self.path)
        if torn_at is not None or no_newline:
            if torn_at is not None:
                _warn_torn(self.path)
            try:
                with os.fdopen(open_plain(self.path, os.O_RDWR), "r+b") as f:   # never a link's target
                    if torn_at is not None:
                        f.truncate(torn_at)  # the line before it, if any, ends with its newline
                    else:
                        f.seek(0, os.SEEK_END)
                        f.write(b"\n")
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise ReslmError(f"could not repair {self.path}: {reason(e)}") from None
        self.rows = len(rows)

    def truncate(self, n: int) -> list[dict]:
        """Keep the first `n` rows (those the checkpoint a run resumes from had seen) and return them. A
        log with fewer than `n` rows (cut short or removed since) is a ReslmError, changing nothing:
        resuming from it would leave a run whose history misses evaluations it made."""
        have = read_metrics(self.path.parent)
        if len(have) < n:
            what = f"has {len(have)} rows" if self.path.exists() else "is missing"
            raise ReslmError(f"{self.path} {what} but the run's {CHECKPOINT} was saved after {n} rows: "
                             f"the log was cut short or removed (restore it from a copy, or start the run again)")
        rows = [_finite_or_none(r) for r in have[:n]]  # NaN from older versions -> null
        for i, r in enumerate(rows, start=1):   # the NaN guard's promise: a run that diverged stops there
            bad = next((k for k, v in r.items() if k.endswith("_loss") and v is None), None)
            if bad is not None:
                raise ReslmError(f"{self.path} row {i} has {bad} null (it was not a finite number): the run diverged "
                                 f"at step {r.get('step')} and stops there; start it again with other settings "
                                 f"(a lower --lr, --grad-clip)")
        text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows)
        atomic_write(self.path, lambda p: p.write_text(text))
        self.rows = len(rows)
        return rows

    def write(self, row: dict) -> None:
        bad = non_finite(row)
        if bad is not None:
            step = row.get("step")
            if isinstance(step, int) and not isinstance(step, bool):  # a diverged run: say where
                raise ReslmError(f"non-finite {bad[0]}={bad[1]} at step {step}: not logged to {self.path} "
                                 f"(metrics must be finite numbers; a diverged run stops here)")
            raise ReslmError(f"cannot log {bad[0]}={bad[1]} to {self.path}: metrics must be finite numbers "
                             f"(JSON has no NaN or Infinity; check a loss before logging it)")
        line = memoryview((json.dumps(row, allow_nan=False) + "\n").encode())
        try:
            fd = open_plain(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise ReslmError(f"could not write {self.path}: {reason(e)}") from None
        start = None
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            while line:
                line = line[os.write(fd, line):]
            os.fsync(fd)
        except OSError as e:
            if start is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)  # no half row left behind
            raise ReslmError(f"could not write {self.path}: {reason(e)}") from None
        finally:
            os.close(fd)
        self.rows += 1


_EVAL_FILES = re.compile(r"^eval(-[^/]+)?\.(json|csv)$")   # what `reslm eval` writes into a run folder


def drop_stale_evals(run_dir: Path) -> list[Path]:
    """Remove the evaluations (eval.json, eval-*.json, eval-physical.csv) of a run folder that are
    older than its checkpoint.pt: they scored weights the run no longer has (`reslm eval` holds the
    run's lock, so an evaluation newer than the checkpoint scored it). Called when a run is resumed,
    before and after it trains, so that no stale eval.json is read as the run's. Regular files only;
    returns what was removed, with a note on stderr."""
    run_dir = Path(run_dir)
    try:
        ck = os.lstat(run_dir / CHECKPOINT)
        entries = list(run_dir.iterdir())
    except OSError:
        return []
    removed = []
    for p in sorted(entries):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if _EVAL_FILES.match(p.name) and stat.S_ISREG(st.st_mode) and st.st_mtime_ns < ck.st_mtime_ns:
            p.unlink()
            removed.append(p)
    if removed:
        print(f"reslm: note: removed {', '.join(p.name for p in removed)} of {run_dir}: older than its checkpoint "
              f"(run `reslm eval {run_dir}` again)", file=sys.stderr)
    return removed


def schedule_key(cfg: dict) -> str:
    """A hash of what fixes a run's schedule (its training config), kept in summary.json."""
    return hashlib.sha256(json.dumps(cfg["train"], sort_keys=True).encode()).hexdigest()[:16]


def is_finished(run_dir: Path) -> bool:
    """True when the run's summary says it reached the end of the schedule its config now asks for."""
    summary = read_json(Path(run_dir) / SUMMARY)
    return (bool(summary) and summary.get("finished") is True
            and summary.get("schedule") == schedule_key(read_config(run_dir)))
