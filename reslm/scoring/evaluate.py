"""Evaluation of a trained run (`reslm eval`): test cross-entropy in nats and bits, a
closed-loop sample, n-gram overlap, and timings with the reservoir's share apart.

What `evaluate_run` measures, on the run's own data (the char runs' test shard, the token runs' val split):
  test_loss     CE (nats per position) on a fixed chunk: the first `score` positions after the first
                `context` (chars for char runs, tokens for token runs; 0 = all of it, in pieces); token
                runs score non-overlapping `context`-token windows and also give bits per character.
                The loss is `reslm.models.base.estimate_loss`, the estimator training uses. Each character
                is scored from its `context` preceding ones; a stream-mode rnn also gets test_stream_loss,
                its state carried through the chunk.
  score_*       the time to score that chunk; generation_* the time to generate `length` symbols
                closed-loop after a prompt (the first `context` symbols of the test text, at most 32 tokens).
  *_reservoir_seconds   the part of each time spent inside the fixed reservoir (every submodule named
                `reservoir`, timed around its forward): what a physical substrate would take over.
                The paper's timings leave it out; a digital user pays it. The trainable part is the rest.
  overlap / distinct   Overlap-n and distinct-n (reslm.ngram) of the generated text against the test text,
                over characters for both kinds of run. Every n must be at most `length`, and `length` at
                most reslm.generate.MAX_LENGTH (checked once the run and its dataset are, before any
                scoring); a token sample that decodes to fewer than n characters gets null for that n.
  physical      rc / aerc runs: the readout-side constraints measured through (reservoir/physical.py), the
                ones trained with (`physical_trained`) and any `physical_overrides`. Test noise is the
                TEST stream, by position in the test text: what training's evaluations drew.

Under other constraints (`physical=` overrides) the result goes to eval-<settings>.json (eval_file_name),
never over the training-time eval.json; many settings at once: reslm.scoring.physical.

A model whose reservoir is not `drivable` (a recorded substrate, reservoir/recorded.py) is scored only:
no sample, empty overlap / distinct, generation_length 0 and a `note` saying so.

On another dataset (`data=NAME`, `reslm eval RUN --data NAME`): a character run scored on the test shard of
another prepared character dataset with the run's very vocabulary (the same ids; another is refused), e.g. a
run of `shakespeare-authors` (the authors' 90/10 split) on `shakespeare`'s test shard and the other way round.
The result goes to eval-on-NAME.json (eval-window-on-NAME.json with --context-mode window), recorded in a
published folder's manifest as eval-window.json is, and keeps `scored_on`: the dataset's name, fingerprint and
test span, and how many characters of that span lie in the run's training shards: counted where the dataset's
token stream is the run's (their tokens.bin hashes agree), so that a figure on text the run trained on is never
read as a held-out one (`scored_on.note`). The run's own dataset is not opened.

`eval_text` is the result as `reslm eval` prints it.
"""
from __future__ import annotations

import platform
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from reslm.core.device import pick_device, synchronize
from reslm.core.errors import ReslmError
from reslm.features import eval_batch_size
from reslm.generate import check_length, sample
from reslm.models.base import count_params, estimate_loss, feature_batches
from reslm.models.reservoir_lm import ReservoirLM
from reslm.ngram import NgramReference, distinct_n
from reslm.run.registry import MANIFEST, is_published, read_manifest, record_file, verify_published, weights_digest
from reslm.reservoir.physical import TEST_KEY, PhysicalConfig, noise_stream
from reslm.core.files import write_json
from reslm.core.metrics import CHECK_LOSS, LN2, TEST_BITS, TEST_BPC, TEST_LOSS, TEST_STREAM_LOSS, bits
from reslm.run import lock_run, read_config
from reslm.data.datasets import check_dataset, data_kind, ensure_dataset, find_dataset, open_dataset
from reslm.data.store import TOKENS, check_name, sample_sha256
from reslm.models.load import load_run
from reslm.scoring.physical import run_physical
from reslm.scoring.pieces import PIECE, Progress, progress_name, timed

EVAL_FILE = "eval.json"


def _score_chars(model, tokens: torch.Tensor, context: int, position: int, clock: dict,
                progress: Progress | None = None, batch_size: int = 1024) -> tuple[float, float, float]:
    """CE over every sample of `tokens` (at `position` of the dataset's stream), in pieces of PIECE samples
    (each with its own `context` lead-in). `clock`: the reservoir_clock running around the call. With
    `progress` (reslm.scoring.pieces.Progress), the pieces it holds are skipped (once its spot piece re-scores to
    what it holds) and its sums saved after each piece. Returns (CE, seconds, reservoir seconds): the time
    is what earlier calls took for the pieces they scored, to add to this call's."""
    def piece(a: int) -> tuple[float, int]:   # the piece starting at sample a: (summed loss, samples)
        feats = model.features(tokens[a:a + PIECE + context], position=position + a,
                               **noise_stream(model, TEST_KEY, a))
        loss, n = estimate_loss(model, feature_batches(feats, eval_batch_size(model, batch_size, feats.targets.device)))
        synchronize(tokens.device)
        return loss * n, n

    p = progress or Progress(Path(), {})
    if p.spot is not None:   # a kept piece scored again before the kept sums are trusted (else started over)
        p.check_spot(*piece(p.spot * PIECE))
    before = p.seconds, p.reservoir_seconds
    for k, a in enumerate(range(0, tokens.numel() - context, PIECE)):
        if k < p.pieces:
            continue
        t0, r0 = time.perf_counter(), clock["seconds"]
        p.add(*piece(a))
        p.seconds += time.perf_counter() - t0
        p.reservoir_seconds += clock["seconds"] - r0
        if progress is not None:
            p.save()
    return p.total / max(p.count, 1), *before


def check_ngrams(ns, length: int) -> tuple[int, ...]:
    """The n of Overlap-n / distinct-n as a tuple of ints in [1, length], checked before any work: a sample
    of `length` symbols has no n-gram longer than itself (its overlap would be undefined, NaN)."""
    try:
        ns = tuple(ns)
    except TypeError:
        raise ReslmError(f"--ngrams must be a list of positive integers, got {ns!r}") from None
    for n in ns:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ReslmError(f"--ngrams must be positive integers, got {n!r}")
        if n > length:
            raise ReslmError(f"--ngrams {n} is longer than the sample (--length {length}): it has no {n}-gram; "
                             f"give --length {n} or more, or smaller --ngrams")
    return tuple(int(n) for n in ns)


def _defined(values: dict) -> dict:
    """NaN (a token sample that decodes to fewer characters than n) -> None, written as null."""
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in values.items()}


def eval_file_name(result: dict) -> str:
    """eval.json; eval-<settings>.json for an evaluation under overridden physical constraints;
    eval-window.json for a stream-trained reservoir scored in window mode (`context_mode`); eval-on-NAME.json
    (eval-window-on-NAME.json) for one on another dataset's test shard (`scored_on`)."""
    if result.get("physical_overrides"):
        return f"eval-{PhysicalConfig(**result['physical']).tag()}.json"
    stem = f"eval-{result['context_mode']}" if result.get("context_mode") else EVAL_FILE.removesuffix(".json")
    return f"{stem}-on-{result['scored_on']['name']}.json" if result.get("scored_on") else f"{stem}.json"


def _other_dataset(cfg: dict, data: str, root: Path | None):
    """The character dataset `data` (a name under `root` or a path; a buildable one is built when missing) that a
    run is scored on instead of its own: a one-line ReslmError unless the run is a character run and the dataset
    has the run's very vocabulary (the same characters, so the same ids)."""
    if data_kind(cfg["data"]) != "chars":
        raise ReslmError("--data scores a character run on another character dataset's test shard; this is a "
                         "token run (its val split is its tokenizer's)")
    ds = find_dataset(data, "chars", root, prepare=True)
    check_name(ds.name)   # it names the result's file
    vocab = cfg["data"].get("vocab")
    if vocab != ds.vocab:
        have, want = len(vocab or []), ds.vocab_size
        diff = sorted(set(ds.vocab) ^ set(vocab or []))
        why = (f"{want} characters against the run's {have}" if have != want else
               "the same number of characters, in another order" if not diff else "other characters")
        shown = "".join(diff[:10]).encode("unicode_escape").decode() if diff else ""
        raise ReslmError(f"dataset {ds.name} has another vocabulary than the run's ({why}"
                         + (f"; differing: {shown!r}" if shown else "")
                         + "): a model scores only text of its own vocabulary")
    return ds


def _same_stream(saved: dict | None, ds) -> bool | None:
    """Whether dataset `ds` holds the very token stream a run's saved fingerprint names (its tokens.bin
    sha256; a fingerprint_version 1 run's sampled checksum), None where the run's fingerprint names none."""
    entry = ((saved or {}).get("files") or {}).get(TOKENS)
    if not isinstance(entry, dict):
        return None
    if "sha256" in entry:
        return entry["sha256"] == ds.fingerprint()["files"][TOKENS]["sha256"]
    if "sample_sha256" in entry:
        return entry.get("bytes") == (ds.path / TOKENS).stat().st_size and \
            entry["sample_sha256"] == sample_sha256(ds.path / TOKENS)
    return None


def scored_on(cfg: dict, ds) -> dict:
    """What an evaluation on another dataset records of it (`scored_on`): its name, fingerprint and test span,
    and, where its token stream is the run's, how many characters of that span the run's training shards hold
    (None where the streams differ or cannot be compared), with a sentence saying what that means."""
    a, b = ds.shards[ds.test_shard]
    data = cfg["data"]
    same = _same_stream(data.get("fingerprint"), ds)
    trained = None
    if same:
        shards = [data["shards"][i] for i in data.get("train_shards", [])]
        trained = sum(max(0, min(e, b) - max(s, a)) for s, e in shards)
    run_data = data.get("name") or Path(str(data.get("path"))).name
    if trained:
        note = (f"not a held-out figure: the run's training shards (dataset {run_data}) hold {trained:,} of the "
                f"{b - a:,} characters of {ds.name}'s test shard [{a:,}, {b:,}) (the same token stream)")
    elif trained == 0:
        note = (f"held out: none of the {b - a:,} characters of {ds.name}'s test shard [{a:,}, {b:,}) is in the "
                f"run's training shards (dataset {run_data}, the same token stream)")
    else:
        note = (f"{ds.name} is not the token stream of the run's dataset {run_data}"
                + (" (their tokens differ)" if same is False else " (the run's fingerprint names none)")
                + ": how much of its test shard the run trained on is not known")
    return dict(name=ds.name, fingerprint=ds.fingerprint(), test_span=[a, b], run_data=run_data,
                same_stream=same, trained_chars_in_test=trained, note=note)


def _with_context_mode(model, cfg: dict, mode: str | None):
    """The model, scoring in context mode `mode` (None: as trained). A reservoir's readout reads states
    however they are computed, so a stream-trained rc / aerc run can be scored on the paper's metric:
    each test character from a zero state over its `context` preceding characters ("window")."""
    if mode is None or mode == getattr(model.config, "context_mode", None):
        return model
    if not isinstance(model, ReservoirLM):
        raise ReslmError(f"--context-mode scores a reservoir run (rc, aerc) in another context mode, not a "
                         f"{cfg['family']} run (a stream-mode rnn's eval gives both metrics)")
    config = replace(model.config, context_mode=mode)
    config.validate()   # a reservoir that has no such mode (a recording) is refused here
    model.config = config
    return model


def _score_tokens(model, tokens: torch.Tensor, context: int, batch: int = 16) -> tuple[float, int]:
    """(CE, positions) over non-overlapping windows of `context` + 1 tokens."""
    n = (tokens.numel() - 1) // context
    windows = tokens[:n * context + 1]
    x, y = windows[:-1].view(n, context), windows[1:].view(n, context)
    loss, count = estimate_loss(model, ((x[i:i + batch], y[i:i + batch]) for i in range(0, n, batch)))
    return loss, count


def evaluate_run(run_dir: Path, *, write: bool = True, **kw) -> dict:
    """Score, generate and compare one trained run (see the notes above); writes run_dir/eval.json.
    With `write`, the run's lock is held for the whole command (a run that is training is refused at
    once, and eval.json never describes other weights than the ones on disk); without it the run is
    only read (a published folder's files are checked against its manifest). The result records the
    sha256 of the weights it scored (weights_sha256), so that publish never ships it with others.

    reference: an `reslm.ngram.NgramReference` of the test text, to reuse across runs (built if None).
    physical: overrides of the run's physical constraints (PhysicalConfig fields); the result then goes
    to run_dir/eval-<settings>.json. context_mode: "window" scores a stream-trained reservoir on the
    paper's metric (each test character from a zero state over its context); the result then goes to
    run_dir/eval-window.json (recorded in a published folder's manifest). data: another character dataset's
    name or path, with the run's vocabulary: its test shard is scored instead of the run's own (see the notes
    above); the result goes to run_dir/eval-on-NAME.json (recorded in a published folder's manifest)."""
    with lock_run(run_dir) if write else nullcontext():
        return _evaluate_run(Path(run_dir), write=write, **kw)


def _evaluate_run(run_dir: Path, *, length: int = 2000, ns=(7, 8), score: int = 65536, temperature: float = 1.0,
                  top_k: int | None = None, top_p: float | None = None, seed: int = 0, device: str = "cpu",
                  reference=None, write: bool = True, physical: dict | None = None,
                  context_mode: str | None = None, root: Path | None = None, data: str | None = None) -> dict:
    for name, v in (("length", length), ("score", score)):
        if not isinstance(v, int) or v < 0 or (name == "length" and v < 1):
            raise ReslmError(f"{name} must be a {'positive' if name == 'length' else 'non-negative'} integer, got {v!r}")
    check_length(length)
    if data is not None and physical:
        raise ReslmError("--data scores the run as trained: the physical-constraint flags are another evaluation "
                         "(give one or the other)")
    run_dir = Path(run_dir)
    dev = pick_device(device)
    model, codec, cfg = load_run(run_dir, dev)
    trained_mode = getattr(model.config, "context_mode", None)
    model = _with_context_mode(model, cfg, context_mode)
    trained, measured = run_physical(model, cfg, physical)
    if physical:
        model.set_physical(measured)
    token_run = data_kind(cfg["data"]) == "tokens"
    if data is None:
        ds, other = open_dataset(cfg["data"], root), None
        check_dataset(cfg, ds)
    else:   # another dataset's test shard, the run's vocabulary (the run's own dataset is not read)
        ds = _other_dataset(cfg, data, root)
        other = scored_on(cfg, ds)
    ns = check_ngrams(ns, length)   # after the run and its dataset are checked, before any scoring
    test, start, prompt_len = _test_text(ds, token_run, model.config.context, run_dir)
    tokens = torch.from_numpy(test).to(dev)
    progress = None   # a char run's scoring written with `write` keeps its progress (reslm.scoring.pieces)
    if token_run:
        scored = _score_token_run(model, tokens, score, codec, test)
    else:
        physics = asdict(measured) if trained is not None else None
        if write:   # named after the evaluation it becomes (eval_file_name)
            progress = _open_progress(run_dir, model, eval_file_name(dict(
                physical_overrides=physical, physical=physics,
                context_mode=context_mode if context_mode != trained_mode else None, scored_on=other)),
                tokens, score, physics, other)
        scored = _score_char_run(model, tokens, score, start, progress)
    sampled = _sample(model, codec, test, prompt_len, length, ns, reference, token_run,
                      dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))
    windows, note = scored.pop("score_windows", None), sampled.pop("note", None)   # kept last in the file
    result = dict(
        run=run_dir.resolve().name if is_published(run_dir) else str(run_dir),   # published: no machine's path
        family=cfg["family"], preset=cfg.get("preset"), kind="tokens" if token_run else "chars",
        trainable_params=count_params(model)[0], **scored, **sampled,
        settings=dict(length=length, score=score, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
        environment=dict(device=str(dev), torch=torch.__version__, python=platform.python_version(),
                         threads=torch.get_num_threads()),
        weights_sha256=weights_digest(model))
    if windows is not None:
        result["score_windows"] = windows
    if context_mode is not None and context_mode != trained_mode:
        result.update(context_mode=context_mode, context_mode_trained=trained_mode)
    if other is not None:
        result["scored_on"] = other
    if trained is not None:
        result.update(physical=asdict(measured), physical_trained=asdict(trained), physical_overrides=physical or {})
    if note:
        result["note"] = note
    if write:   # under the lock evaluate_run holds
        _write_result(run_dir, result, progress)
    return result


def _test_text(ds, token_run: bool, context: int, run_dir: Path) -> tuple[np.ndarray, int, int]:
    """(the symbols scored, where they start in the dataset, the prompt's length): a token run's val split
    (prompt: at most 32 tokens), a char run's test shard (prompt: one context)."""
    if token_run:
        test, start, prompt_len = np.asarray(ds.val, dtype=np.int64), 0, min(context, 32)
    else:
        start, b = ds.shards[ds.test_shard]
        test, prompt_len = np.asarray(ds.tokens[start:b], dtype=np.int64), context
    if len(test) <= prompt_len + 1:
        raise ReslmError(f"the test text of {run_dir} is too short ({len(test)} symbols)")
    return test, start, prompt_len


def _score_token_run(model, tokens: torch.Tensor, score: int, codec, test: np.ndarray) -> dict:
    """A token run's test figures: `score` predicted tokens (whole windows of `context`) after the first token,
    and bits per character of the text they decode to."""
    context = model.config.context
    chunk = tokens if score == 0 else tokens[:score + 1]
    (loss, positions), score_s, score_res = timed(lambda _: _score_tokens(model, chunk, context), model)
    if positions == 0:
        raise ReslmError(f"--score {score} is shorter than one window of the model's context ({context})")
    chars = len(codec.decode(test[1:positions + 1]))
    return {TEST_LOSS: loss, TEST_BITS: bits(loss), TEST_BPC: loss * positions / max(chars, 1) / LN2,
            "score_positions": positions, **_score_times(score_s, score_res), "score_windows": positions // context}


def _open_progress(run_dir: Path, model, name: str, tokens: torch.Tensor, score: int, physics,
                   other: dict | None = None) -> Progress:
    """The kept progress of a char run's scoring into `name` (reslm.scoring.pieces), continued where it holds
    pieces. On another dataset (`other`: scored_on) its fingerprint is part of what the progress names."""
    context = model.config.context
    positions = (tokens.numel() if score == 0 else min(tokens.numel(), score + context)) - context
    key = dict(weights_sha256=weights_digest(model), score_positions=positions, piece=PIECE,
               context_mode=getattr(model.config, "context_mode", None), physical=physics)
    if other is not None:
        key["scored_on"] = dict(fingerprint=other["fingerprint"], test_span=other["test_span"])
    progress = Progress.open(run_dir / progress_name(name), key)
    if progress.pieces:
        print(f"reslm: note: continuing the scoring of {run_dir} after the {progress.pieces} pieces of "
              f"{progress.count:,} samples kept in {progress.path.name} (its piece {progress.spot + 1} "
              "scored again first)", file=sys.stderr)
    return progress


def _score_char_run(model, tokens: torch.Tensor, score: int, start: int, progress: Progress | None) -> dict:
    """A char run's test figures: `score` samples, each position after the first `context` characters read
    from the `context` before it; a stream-mode rnn also with its state carried through them
    (CharRNN.stream_loss)."""
    context = model.config.context
    chunk = tokens if score == 0 else tokens[:score + context]
    (loss, *before), score_s, score_res = timed(
        lambda clock: _score_chars(model, chunk, context, start, clock, progress), model)
    stream = ({TEST_STREAM_LOSS: model.stream_loss(chunk)[0]}
              if getattr(model, "all_positions", None) == "streams" else {})
    return {TEST_LOSS: loss, TEST_BITS: bits(loss), TEST_BPC: bits(loss), "score_positions": chunk.numel() - context,
            **stream, **_score_times(score_s + before[0], score_res + before[1])}   # + pieces an earlier call scored


def _score_times(seconds: float, reservoir: float) -> dict:
    return dict(score_seconds=seconds, score_reservoir_seconds=reservoir, score_trainable_seconds=seconds - reservoir)


def _sample(model, codec, test: np.ndarray, prompt_len: int, length: int, ns, reference, token_run: bool,
            how: dict) -> dict:
    """The closed-loop sample after the test text's first `prompt_len` symbols, its timings and its n-gram
    overlap with the test text (`reference`: an NgramReference of it, built when None). A recording
    (reservoir/recorded.py) cannot read the symbols it would generate: no sample, and a note saying so."""
    drivable = not isinstance(model, ReservoirLM) or model.reservoir.drivable
    prompt = test[:prompt_len].tolist()
    gen, gen_s, gen_res = timed(lambda _: sample(model, prompt, length, **how), model) if drivable else ([], 0.0, 0.0)
    text = codec.decode(gen)
    if reference is None and drivable:
        reference = NgramReference(codec.decode(test)) if token_run else NgramReference(test, base=len(codec.vocab))
    generated = text if token_run else np.asarray(gen, dtype=np.int64)
    ns = ns if drivable else ()
    out = dict(generation_length=length if drivable else 0, generation_seconds=gen_s,
               generation_reservoir_seconds=gen_res, generation_trainable_seconds=gen_s - gen_res,
               overlap=_defined({str(n): reference.overlap(generated, n) for n in ns}),
               distinct=_defined({str(n): distinct_n(generated, n) for n in ns}),
               prompt=codec.decode(prompt), sample=text)
    if not drivable:
        out["note"] = "no sample: a recorded substrate cannot be driven with generated text"
    return out


def _write_result(run_dir: Path, result: dict, progress: Progress | None) -> None:
    """The result into its eval file (a published folder's manifest records it), its kept progress dropped."""
    name = eval_file_name(result)
    write_json(run_dir / name, result)
    if is_published(run_dir) and (name == EVAL_FILE or result.get("context_mode") or result.get("scored_on")):
        record_file(run_dir, name)   # a results/ folder: its manifest stays true
    if progress is not None:
        progress.drop()


CHECK_POSITIONS = 16_384   # test positions (tokens: val tokens) of a published run's check (score_check)


def score_check(run_dir: Path, positions: int = CHECK_POSITIONS, device: str = "cpu", root: Path | None = None) -> dict:
    """The run's CE on the first `positions` positions of its held-out text (the test shard; the val split
    of a token run), scored as `reslm eval` scores it, and the digest of the weights scored: what a
    published run's manifest keeps as its check and `reslm verify` re-scores. Reads the run only (`root`:
    where a published run's dataset is, as open_dataset)."""
    r = _evaluate_run(Path(run_dir), length=1, ns=(1,), score=positions, seed=0, device=device, write=False,
                      root=root)
    return {"positions": r["score_positions"], CHECK_LOSS: r[TEST_LOSS], "weights_digest": r["weights_sha256"]}


def record_check(folder: Path, positions: int = CHECK_POSITIONS, device: str = "cpu",
                 root: Path | None = None) -> dict | None:
    """Write a check into the manifest of a published run that has none (or one of other weights), after
    its files verify; returns the check written, or None when it had a current one."""
    with lock_run(folder):   # nobody trains in it or publishes into it meanwhile
        manifest = verify_published(folder)
        ensure_dataset(read_config(folder), root)
        got = score_check(folder, positions, device=device, root=root)
        have = manifest.get("check")
        if have and have.get("weights_digest") == got["weights_digest"] and have.get("positions") == got["positions"]:
            return None
        write_json(Path(folder) / MANIFEST, {**read_manifest(folder), "check": got})
    return got


# --- the result as `reslm eval` prints it ------------------------------------------------------------
def eval_text(r: dict) -> str:
    """An evaluate_run result as text: the CE, the constraints, the timings, overlap and the sample."""
    unit = "token" if r["kind"] == "tokens" else "char"
    split = "val split" if unit == "token" else "test text"   # token datasets have train and val only
    lines = [f"{r['run']}: {r['family']} {r.get('preset') or ''} ({r['trainable_params']:,} trainable parameters)",
             f"{split.split()[0]} CE {r[TEST_LOSS]:.4f} nats/{unit} = {r[TEST_BITS]:.3f} bits/{unit}"
             + (f" = {r[TEST_BPC]:.3f} bits/char" if unit == "token" else "")
             + f" over {r['score_positions']:,} positions "
             + (f"(the whole {split})" if r["settings"]["score"] == 0 else f"(the start of the {split} only; "
                "--score 0 scores all of it, as the README's table does)")
             + f"; scored in {r['score_seconds']:.2f} s (reservoir {r['score_reservoir_seconds']:.2f} s)"]
    if "scored_on" in r:
        on = r["scored_on"]
        lines.append(f"on dataset {on['name']}'s test shard, not the run's own ({on['run_data']}): {on['note']}")
    if "physical" in r:
        shown = PhysicalConfig(**r["physical"]).describe()
        trained = PhysicalConfig(**r["physical_trained"]).describe()
        lines.append(f"readout constraints: {shown}" + (f" (trained with: {trained})" if r["physical_overrides"]
                                                        else " (as trained)"))
    if "note" not in r:
        lines.append(f"generated {r['generation_length']:,} {unit}s in {r['generation_seconds']:.2f} s "
                     f"(reservoir {r['generation_reservoir_seconds']:.2f} s)")
    for n in r["overlap"]:
        shown = [f"{v:.4f}" if v is not None else "n/a" for v in (r["overlap"][n], r["distinct"][n])]
        lines.append(f"overlap-{n} {shown[0]}   distinct-{n} {shown[1]}")
    if "note" in r:
        lines.append(r["note"])
    else:
        lines += [f"--- sample (temperature {r['settings']['temperature']}) ---", r["prompt"] + r["sample"]]
    return "\n".join(lines)
