"""`reslm memory`: how far back a trained model reads. Each scored test symbol is predicted from
exactly its k preceding symbols, read from a zero state, for every k of a list of lengths; the test
CE against k shows how much context a model turns into prediction, and where it stops gaining.
Several runs are scored on the same positions, so their difference at each k is paired: its standard
error is that of the per-position differences, far below either curve's own.

    P positions     evenly spread over one text, each at least max(lengths) symbols from the start of
                    its stretch of that text, the same for every k and run: `text` "test" (chars: the
                    test shard; tokens: the val split), "val" (chars: the runs' validation split) or
                    "train" (the text the runs trained on, their validation split left out), so that CE
                    on the training text beside CE on the test text tells fit from generalisation
    k symbols       a reservoir model (rc / aerc, either context mode) reads them with forward, which steps
                    its reservoir through them from a zero state and reads the head once; another
                    model with a state (rnn, laerc, gpt) steps through them from init_state; a
                    window model (tf) reads them with forward, for k up to its context (longer k: no
                    figure)

The figures are CE in nats per symbol with the standard error of the mean over positions; they are
not the run's test CE (that scores every position of the whole text at the run's own protocol).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from reslm.core.device import amount, check_memory
from reslm.core.errors import OutOfMemory, ReslmError
from reslm.core.files import atomic_write, write_json
from reslm.core.metrics import MEMORY_LOSS, bits
from reslm.core.progress import bar
from reslm.data.datasets import check_dataset, data_kind, open_dataset
from reslm.data.splits import ShardSplit
from reslm.models.base import count_params
from reslm.models.load import load_run
from reslm.run import read_config
from reslm.run.registry import is_published
from reslm.settings import TrainConfig

LENGTHS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
POSITIONS = 16_384
BATCH = 4_096
TEXTS = ("test", "val", "train")


def check_lengths(lengths) -> tuple[int, ...]:
    """The lengths, sorted and unique; each an integer >= 1."""
    if not lengths or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in lengths):
        raise ReslmError(f"lengths must be integers >= 1, got {list(lengths)}")
    return tuple(sorted(set(lengths)))


def profile_bytes(positions: int, longest: int, batch: int = BATCH) -> int:
    """What a memory profile holds at once, at least: its `positions` windows of `longest` + 1 symbols laid
    end to end (int64) and, while they are read, their indices into the text (as many), then one batch of
    them as the model's input (reslm.core.device.check_memory holds it against memory before anything is
    read)."""
    return 16 * (longest + 1) * positions + 8 * longest * min(batch, positions)


def memory_positions(spans, longest: int, positions: int) -> torch.Tensor:
    """(P,) long: P target indices evenly spread over the spans [a, b) of a text (in order; an int n:
    the whole text [0, n)), each with at least `longest` symbols of its own span before it; fewer when
    the spans hold fewer such targets."""
    if isinstance(spans, int):
        spans = [(0, spans)]
    spans = [(a + longest, b) for a, b in spans if b > a + longest]
    room = sum(b - a for a, b in spans)
    if room < 1:
        raise ReslmError(f"the text is too short for a length of {longest}")
    P = min(positions, room)
    ranks = torch.arange(P, dtype=torch.long) * room // P              # evenly over the spans laid end to end
    sizes = torch.tensor([b - a for a, b in spans], dtype=torch.long)
    ends = sizes.cumsum(0)
    i = torch.searchsorted(ends, ranks, right=True)
    return torch.tensor([a for a, _ in spans], dtype=torch.long)[i] + ranks - (ends - sizes)[i]


def _stepper(model):
    """The model's way of reading a window from a zero state: 'window' (forward, any length: a reservoir
    model, whose forward steps its reservoir through the window and reads the head once), 'step' or
    'forward' (a window model, up to its context)."""
    if getattr(model, "reads_any_window", False):
        return "window"
    return "step" if hasattr(model, "step") and hasattr(model, "init_state") else "forward"


def reachable(model, k: int) -> bool:
    """Whether the model can read a window of k symbols from a zero state."""
    if _stepper(model) != "forward":
        limit = getattr(model, "max_positions", None)
        return limit is None or k <= limit
    return k <= model.config.context


@torch.no_grad()
def window_losses(model, tokens: torch.Tensor, targets: torch.Tensor, k: int, batch: int = BATCH) -> torch.Tensor:
    """(P,) float64: the CE of tokens[t] predicted from tokens[t - k : t] read from a zero state, t in targets."""
    out = []
    offsets = torch.arange(-k, 0, device=tokens.device)
    for a in range(0, targets.numel(), batch):
        t = targets[a:a + batch].to(tokens.device)
        idx = tokens[t[:, None] + offsets]                      # (B, k)
        how = _stepper(model)
        if how == "step":
            state = model.init_state(idx.shape[0], device=tokens.device)
            for j in range(k):
                logits, state = model.step(idx[:, j], state)
        else:
            if how == "window":
                model.init_state(idx.shape[0], device=tokens.device)   # the measurement clock, as step's
            logits = model(idx)[0][:, -1]
        out.append(F.cross_entropy(logits.float(), tokens[t], reduction="none").double().cpu())
    return torch.cat(out)


def _text(cfg: dict, which: str) -> tuple[np.ndarray, list[tuple[int, int]], str]:
    """The run's dataset as one token array (a memory map: only the windows scored are read), the spans
    of it that are `which` text, and their name."""
    ds = open_dataset(cfg["data"])
    check_dataset(cfg, ds)
    if data_kind(cfg["data"]) == "tokens":
        tokens = ds.train if which == "train" else ds.val
        return tokens, [(0, len(tokens))], "the train split" if which == "train" else "the val split"
    tokens = ds.tokens
    if which == "test":
        return tokens, [ds.shards[ds.test_shard]], "the test shard"
    tc = TrainConfig.of_run(cfg)
    if which == "val" and not tc.heldout:
        raise ReslmError(f"{cfg.get('preset') or 'this run'} kept no text out of training: "
                         "--text test or train")
    split = ShardSplit.of_run(ds, cfg["model"]["context"], tc, tc.heldout)
    if which == "train":
        spans = [split.span(s) for s in ds.train_shards]
        return tokens, spans, "the training text" + (" (the held-out text left out)" if tc.heldout else "")
    spans = [split.heldout_span(s) for s in split.heldout_shards()]
    return tokens, spans, "the held-out text (the validation split)" if tc.heldout == tc.val_fraction else \
        "the held-out tails"


def _stats(x: torch.Tensor) -> tuple[float, float]:
    """(mean, standard error of the mean)."""
    n = x.numel()
    return float(x.mean()), float(x.std(unbiased=True) / math.sqrt(n)) if n > 1 else 0.0


def memory_profile(run_dirs, lengths=LENGTHS, positions: int = POSITIONS, device: str | torch.device = "cpu",
                   batch: int = BATCH, progress: bool = True, text: str = "test") -> dict:
    """The CE of each run at each length on one set of positions of `text` (TEXTS), and each run's paired
    difference from the first (module doc)."""
    lengths = check_lengths(lengths)
    if text not in TEXTS:
        raise ReslmError(f"text must be one of {', '.join(TEXTS)}, got {text!r}")
    if not run_dirs:
        raise ReslmError("name at least one run")
    if positions < 1 or batch < 1:
        raise ReslmError(f"positions and batch must be >= 1, got {positions} and {batch}")
    cfgs = [read_config(Path(r)) for r in run_dirs]
    first = cfgs[0]["data"]
    for r, cfg in zip(run_dirs[1:], cfgs[1:]):
        if cfg["data"].get("fingerprint") != first.get("fingerprint"):
            raise ReslmError(f"{r} was trained on {cfg['data'].get('name')}, {run_dirs[0]} on {first.get('name')} "
                             "(another fingerprint): runs are compared on one text")
    symbols, spans, where = _text(cfgs[0], text)
    for r, cfg in zip(run_dirs[1:], cfgs[1:]):
        if _text(cfg, text)[1] != spans:
            raise ReslmError(f"{r} and {run_dirs[0]} trained on different parts of the text (another validation "
                             f"split): their {text} text differs")
    dev = torch.device(device)
    longest = max(lengths)
    at = memory_positions(spans, longest, positions).numpy()   # a text too short for the lengths: refused here
    need = profile_bytes(len(at), longest, batch)
    what = f"the memory profile ({len(at):,} windows of {longest + 1:,} symbols)"
    fix = "give shorter --lengths or fewer --positions"
    check_memory(need, what, fix)   # before any window is read or model built: exit 2 never, 75 not now
    if dev.type == "cuda":
        check_memory(need, what + " on the GPU", fix, dev)
    # the scored windows laid end to end, each its target and the `longest` symbols before it
    try:
        windows = np.asarray(symbols[(at[:, None] + np.arange(-longest, 1)).ravel()], dtype=np.int64)
    except MemoryError:   # the check above counts what is free now; another process may have taken it since
        raise OutOfMemory(f"{what} needs at least {amount(need)}, which could not be had now: free memory, "
                          f"or {fix}") from None
    tokens = torch.from_numpy(windows).to(dev)
    targets = longest + torch.arange(len(at), dtype=torch.long) * (longest + 1)
    runs, per_position = [], []
    for run_dir in run_dirs:
        model, _, cfg = load_run(Path(run_dir), dev)
        model.eval()
        losses, row = {}, {}
        for k in bar(lengths, desc=Path(run_dir).name, unit="length", enabled=progress, leave=False):
            if reachable(model, k):
                losses[k] = window_losses(model, tokens, targets, k, batch)
        per_position.append(losses)
        row = dict(run=Path(run_dir).resolve().name if is_published(Path(run_dir)) else str(run_dir),
                   family=cfg["family"], trainable_params=count_params(model)[0],
                   **{MEMORY_LOSS: {str(k): _stats(losses[k])[0] if k in losses else None for k in lengths}},
                   se={str(k): _stats(losses[k])[1] if k in losses else None for k in lengths})
        runs.append(row)
    paired = []
    for row, losses in zip(runs[1:], per_position[1:]):
        base = per_position[0]
        both = [k for k in lengths if k in losses and k in base]
        diffs = {k: _stats(losses[k] - base[k]) for k in both}
        paired.append(dict(run=row["run"], against=runs[0]["run"],
                           difference={str(k): diffs[k][0] if k in diffs else None for k in lengths},
                           se={str(k): diffs[k][1] if k in diffs else None for k in lengths}))
    return dict(data=first.get("name"), split=text, text=where, text_symbols=sum(b - a for a, b in spans),
                positions=int(targets.numel()),
                lengths=list(lengths), unit="nats/symbol", runs=runs, paired=paired)


def memory_text(result: dict) -> str:
    """The profile as a table: one row per length, each run's CE (± its standard error) and, for a second
    run on, its paired difference from the first."""
    runs, paired = result["runs"], result["paired"]
    lines = [f"{result['split']} CE (nats per symbol, ± standard error) of each of {result['positions']:,} "
             f"positions of {result['text']} ({result['text_symbols']:,} symbols) predicted from exactly k "
             "symbols before it:"]
    for i, r in enumerate(runs):
        lines.append(f"  [{i}] {r['run']} ({r['family']}, {r['trainable_params']:,} trainable)")
    head = ["k"] + [f"[{i}]" for i in range(len(runs))] + [f"[{i}] - [0]" for i in range(1, len(runs))]
    rows = []
    for k in map(str, result["lengths"]):
        cells = [k]
        for r in runs:
            v = r[MEMORY_LOSS][k]
            cells.append("-" if v is None else f"{v:.4f} ± {r['se'][k]:.4f} ({bits(v):.3f} bits)")
        for p in paired:
            d = p["difference"][k]
            cells.append("-" if d is None else f"{d:+.4f} ± {p['se'][k]:.4f}")
        rows.append(cells)
    widths = [max(len(c[i]) for c in [head, *rows]) for i in range(len(head))]
    for cells in [head, *rows]:
        lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths)))
    lines.append("(-: the model cannot read that many symbols from a zero state)")
    return "\n".join(lines)


def line_plot(path: Path, draw, figsize=(6, 4)) -> None:
    """A one-axes figure drawn by draw(ax), with a grid and a legend, written atomically to `path` (.png):
    the --plot of `reslm memory` and `reslm recall`. ReslmError (one line) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReslmError("--plot needs matplotlib (pip install matplotlib)") from None
    fig, ax = plt.subplots(figsize=figsize)
    try:
        draw(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=120))
    finally:
        plt.close(fig)


def plot_memory(result: dict, path: Path) -> None:
    """Test CE against k (log scale), one line per run, written atomically to `path` (.png)."""
    line_plot(path, lambda ax: _draw_memory(result, ax))


def _draw_memory(result: dict, ax) -> None:
    for r in result["runs"]:
        ks = [int(k) for k, v in r[MEMORY_LOSS].items() if v is not None]
        ax.errorbar(ks, [r[MEMORY_LOSS][str(k)] for k in ks], yerr=[r["se"][str(k)] for k in ks], marker="o",
                    capsize=2, label=f"{r['run']} ({r['trainable_params']:,})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("symbols read before the target (k)")
    ax.set_ylabel(f"{result['split']} CE (nats per symbol)")
    ax.set_title(f"{result['positions']:,} positions of {result['text']}")


def write_memory(result: dict, path: Path) -> None:
    """The profile as strict JSON, atomically."""
    write_json(path, result)
