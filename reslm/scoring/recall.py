"""`reslm recall`: how far back a reservoir's state still holds the text, before any readout is trained.

For each lag k, a linear decoder (ridge regression on one-hot targets, reslm.core.linear) learns to name
the character k steps back from the features a model's fixed part computes (its reservoir states as its
head sees them: measured, projected, normalised). Its held-out accuracy says whether the state still
holds that character. This is the reservoir field's memory capacity (Jaeger's MC, a sum over lags of
how well a linear readout recovers the input k steps back) for a symbol stream:

    recall_k = max(0, (accuracy_k - m) / (1 - m))    m: the share of the most frequent character among
                                                     the scored ones (always naming it scores m): 0 is
                                                     no better than that guess, 1 names every character
    capacity = the sum of recall_k over lags 1..K    in characters, at most K

A linear decoder gives a lower bound on what the state holds (an MLP head can read more), but it compares
substrates on equal terms, and costs one state pass and one solve: a minute where training a head costs
an hour. On real text the recall counts what a decoder can name, held in the state or inferred from what
it holds (the letters before "ing" are guessable); on text of independent characters it is only what is
held. A trained GRU/LSTM run is read the same way, from its hidden state h (what its head reads), to set
a fixed reservoir beside a trained one.

Text. The first `fit` + `score` characters of the dataset's first training shard (never the test shard),
read the way the model's features are read in training (its context mode; stream mode in pieces of at
least PIECE characters, so that each scored state has a long history). The decoders are solved on the
first `fit` samples; the samples after them (at least `score`: the text read has a margin for the
lags and a recurrent network's piece starts) are split in two: the first half picks the ridge penalty of
ALPHAS for each lag (by the CE of its softmax with a fitted temperature), the second half is scored.
Only samples with at least max_lag characters before them are used, the same for every lag.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from reslm.core.errors import ReslmError
from reslm.core.files import write_json
from reslm.core.progress import bar
from reslm.data.datasets import check_dataset, data_kind, open_dataset
from reslm.scoring.memory import line_plot
from reslm.models import family
from reslm.models.base import count_params
from reslm.models.load import load_model, load_run, load_run_model
from reslm.models.reservoir_lm import ReservoirLM
from reslm.models.rnn import CharRNN
from reslm.run import read_config
from reslm.run.registry import is_published
from reslm.core.linear import RidgeAccumulator, fit_temperature

MAX_LAG = 32
FIT = 100_000
SCORE = 20_000
PIECE = 4_096                     # stream mode: the shortest piece of text a state is carried through
ALPHAS = (1e-6, 1e-4, 1e-2)       # the ridge penalties tried (relative to the mean feature power)


def check_lags(max_lag: int, fit: int, score: int) -> None:
    if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 1:
        raise ReslmError(f"the largest lag must be an integer >= 1, got {max_lag!r}")
    if fit < 1_000 or score < 1_000:
        raise ReslmError(f"fit and score need at least 1,000 characters each, got {fit:,} and {score:,}")


def check_model(name: str, cfg: dict, run_dir: Path | None) -> None:
    """ReslmError unless the config is a reservoir family's (rc, aerc) on characters, or a trained
    recurrent network's (an rnn run)."""
    fam = family(cfg["family"]).model
    if data_kind(cfg["data"]) != "chars" or not issubclass(fam, (ReservoirLM, CharRNN)):
        raise ReslmError(f"recall reads a reservoir's states (or a trained GRU/LSTM's) on characters; {name} is "
                         f"family {cfg['family']} on {data_kind(cfg['data'])}")
    if fam is CharRNN and run_dir is None:
        raise ReslmError(f"{name}: a recurrent network's state is read from a trained run, not from a plan")


def model_of(cfg: dict, run_dir: Path | None = None, device="cpu"):
    """The model a run config describes: a reservoir's fixed part (the trained weights are not read), or
    a trained rnn run with its weights."""
    if cfg["family"] == "rnn":
        return load_run(run_dir, device)[0].eval()
    model = load_run_model(run_dir, cfg, device) if run_dir is not None else load_model(cfg, device)
    return model.eval()


@torch.no_grad()
def features(model, text: np.ndarray, position: int, max_lag: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(X (M, D) float32, current (M,) long): the features of every sample of `text` (its model's
    context mode) whose current character has at least max_lag characters before it, and the index in
    `text` of each sample's current character. A recurrent network's are its hidden state h (what its
    head reads) after each character, `text` read in pieces of PIECE from a zero state."""
    if isinstance(model, CharRNN):
        return _rnn_features(model, text, max_lag)
    c = model.config
    if c.context_mode == "stream":   # pieces of at least PIECE characters (the model's own streams at most)
        c.streams = max(1, min(c.streams, len(text) // PIECE))
    tokens = torch.from_numpy(text.astype(np.int64)).to(model.embedding.device)
    X = model.features(tokens, position=position).inputs.float()
    current = torch.arange(c.context - 1, c.context - 1 + X.shape[0], device=X.device)   # sample i: after text[context-1+i]
    keep = current >= max_lag
    return X[keep], current[keep]


def _rnn_features(model, text: np.ndarray, max_lag: int) -> tuple[torch.Tensor, torch.Tensor]:
    device = model.head.weight.device
    P = max(1, len(text) // PIECE)
    L = len(text) // P
    tokens = torch.from_numpy(text[:P * L].astype(np.int64)).to(device)
    out, _ = model.rnn(model.embed(tokens.view(P, L)))                 # (P, L, H), each piece from zero
    current = torch.arange(P * L, device=device)
    keep = current % L >= max_lag
    return out.reshape(P * L, -1).float()[keep], current[keep]


def _targets(tokens: torch.Tensor, current: torch.Tensor, lags: range, V: int) -> torch.Tensor:
    """(M, L) long: column j is lag j's class, j V + the character lags[j] steps before the current one."""
    return torch.stack([j * V + tokens[current - k] for j, k in enumerate(lags)], dim=1)


@torch.no_grad()
def recall_of(X: torch.Tensor, current: torch.Tensor, tokens: torch.Tensor, V: int, lags: range, fit: int) -> dict:
    """Per-lag held-out accuracy, CE and recall (module doc) of linear decoders solved on X[:fit]."""
    if X.shape[0] < fit + 200:
        raise ReslmError(f"only {X.shape[0]:,} samples for {fit:,} to fit and the rest to score")
    L, D = len(lags), X.shape[1]
    y = _targets(tokens, current, lags, V)
    acc = RidgeAccumulator(D, L * V, device=X.device)
    acc.add(X[:fit], y[:fit])
    rest, yr = X[fit:], y[fit:] - torch.arange(L, device=y.device) * V
    half = rest.shape[0] // 2
    ones = rest.new_ones(rest.shape[0], 1)
    Xr = torch.cat([rest, ones], dim=1)
    best = [None] * L    # (picking CE, beta, alpha, W columns) per lag
    for alpha in ALPHAS:
        Z = (Xr @ acc.solve(alpha).float()).view(-1, L, V)
        for j in range(L):
            beta, ce = fit_temperature(Z[:half, j], yr[:half, j])
            if best[j] is None or ce < best[j][0]:
                best[j] = (ce, beta, alpha, Z[half:, j].clone())
    scored = yr[half:]
    freq = torch.bincount(scored[:, 0], minlength=V).double()   # the scored characters (lag k's targets are
    majority = (freq.max() / freq.sum()).item()                   # the same text k characters earlier)
    rows = []
    for j, k in enumerate(lags):
        _, beta, alpha, z = best[j]
        accuracy = (z.argmax(1) == scored[:, j]).double().mean().item()
        rows.append(dict(lag=k, accuracy=accuracy, recall=max(0.0, (accuracy - majority) / (1 - majority)),
                         ce=F.cross_entropy(z * beta, scored[:, j]).item(), alpha=alpha, temperature=1 / beta))
    return dict(majority=majority, scored=int(scored.shape[0]), lags=rows,
                capacity=sum(r["recall"] for r in rows if r["lag"] >= 1))


def recall_profile(items, max_lag: int = MAX_LAG, fit: int = FIT, score: int = SCORE, device="cpu",
                   progress: bool = True) -> dict:
    """items: (name, run config, run folder or None) of reservoir models on one character dataset ->
    each one's recall by lag (module doc), on the same text."""
    check_lags(max_lag, fit, score)
    if not items:
        raise ReslmError("name at least one run or plan configuration")
    for name, cfg, run_dir in items:
        check_model(name, cfg, run_dir)
    first = items[0][1]["data"]
    for name, cfg, _ in items[1:]:
        if cfg["data"].get("fingerprint") != first.get("fingerprint"):
            raise ReslmError(f"{name} is on {cfg['data'].get('name')}, {items[0][0]} on {first.get('name')} "
                             "(another fingerprint): recall is compared on one text")
    ds = open_dataset(first)
    check_dataset(items[0][1], ds)
    a, b = ds.shards[ds.train_shards[0]]
    lags = range(0, max_lag + 1)
    runs = []
    for name, cfg, run_dir in bar(items, desc="recall", unit="model", enabled=progress and len(items) > 1):
        model = model_of(cfg, run_dir, device)
        context = model.config.context
        rnn = isinstance(model, CharRNN)
        need = fit + score + max_lag + context + (max_lag + 1) * (fit + score) // PIECE   # rnn: each piece's start
        if b - a < need:
            raise ReslmError(f"the first training shard has {b - a:,} characters; fit + score + lags need {need:,}")
        text = np.asarray(ds.tokens[a:a + need], dtype=np.int64)
        X, current = features(model, text, a, max_lag)
        r = recall_of(X, current, torch.from_numpy(text).to(X.device), model.config.vocab_size, lags, fit)
        runs.append(dict(name=name, family=cfg["family"], trainable_params=count_params(model)[0],
                         reservoir=model.config.cell if rnn else model.config.reservoir,
                         size=model.config.hidden if rnn else model.reservoir.size, features=int(X.shape[1]),
                         context_mode=model.config.context_mode, **r))
    return dict(data=first.get("name"), text=f"training shard {ds.train_shards[0]}, characters from {a:,}",
                fit=fit, score=score, max_lag=max_lag, decoder="ridge on one-hot targets, softmax with a fitted "
                "temperature", runs=runs)


def recall_text(result: dict) -> str:
    """The profile as a table: each lag's held-out accuracy and recall for every model."""
    runs = result["runs"]
    lines = [f"linear recall of the character k steps back, from each model's features ({result['fit']:,} "
             f"samples to fit, {runs[0]['scored']:,} scored; {result['text']} of {result['data']}):"]
    for i, r in enumerate(runs):
        lines.append(f"  [{i}] {r['name']} ({r['reservoir']}, N={r['size']:,}, {r['features']:,} features): "
                     f"capacity {r['capacity']:.2f} characters over lags 1-{result['max_lag']} "
                     f"(the most frequent character is {r['majority']:.1%} of those scored)")
    head = ["k"] + [f"[{i}] accuracy recall" for i in range(len(runs))]
    rows = [[str(row["lag"])] + [f"{r['lags'][j]['accuracy']:8.1%} {r['lags'][j]['recall']:6.3f}" for r in runs]
            for j, row in enumerate(runs[0]["lags"])]
    widths = [max(len(c[i]) for c in [head, *rows]) for i in range(len(head))]
    for cells in [head, *rows]:
        lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths)))
    return "\n".join(lines)


def plot_recall(result: dict, path: Path) -> None:
    """Recall against the lag, one line per model, written atomically to `path` (.png)."""
    line_plot(path, lambda ax: _draw_recall(result, ax), figsize=(6.5, 4))


def _draw_recall(result: dict, ax) -> None:
    for i, r in enumerate(result["runs"]):
        rows = [x for x in r["lags"] if x["lag"] >= 1]
        style = ("-", "--", ":")[i // 10 % 3]   # the colours repeat after ten lines
        ax.plot([x["lag"] for x in rows], [x["recall"] for x in rows], marker=".", linestyle=style,
                label=f"{r['name']} (capacity {r['capacity']:.2f})")
    ax.set_xlabel("lag k (characters back)")
    ax.set_ylabel("linear recall of c[t-k]")
    ax.set_title(f"{result['fit']:,} samples to fit, {result['runs'][0]['scored']:,} scored "
                 "(0: the most frequent character, 1: every one)", fontsize=9)


def write_recall(result: dict, path: Path) -> None:
    """The profile as strict JSON, atomically."""
    write_json(path, result)


def run_item(path: Path) -> tuple[str, dict, Path]:
    """(name, config, folder) of a run directory or published results/NAME."""
    cfg = read_config(path)
    return (path.resolve().name if is_published(path) else str(path)), cfg, path
