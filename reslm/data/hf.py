"""Corpus -> tokens: token datasets streamed from a Hugging Face `datasets` source (OpenWebText).

The paper trains LAERC on OpenWebText with the GPT-2 vocabulary. With internet access::

    reslm data bpe --corpus openwebtext --max-docs 100000 --tokenizer gpt2

``openwebtext`` is short for ``hf:Skylion007/openwebtext``; any ``hf:NAME`` on the hub works the same
way (``--hf-config``, ``--hf-split``, ``--text-field`` pick the subset, split and text column). A local
data folder or file works too, which is how the tests run it without a network::

    reslm data bpe --corpus hf:/data/my-jsonl-folder --tokenizer bpe:4096
    reslm data bpe --corpus hf:/data/docs.jsonl --tokenizer gpt2

A folder is passed to ``datasets.load_dataset(folder)``; a file by its extension to the ``json``
(``.json``/``.jsonl``), ``parquet``, ``csv`` or ``text`` builder. The source is read with
``streaming=True``: documents arrive one at a time, nothing is materialised in the HF cache, and
memory does not grow with the corpus. ``--max-docs N`` stops after the first N documents.

Split: a stream has no known length, so validation is chosen by document index: with
k = round(1 / val_fraction), documents k-1, 2k-1, ... (every k-th) go to the val view and the others to
the train view (``val_fraction`` 0.01: every 100th document). OpenWebText documents are independent
web pages, so an interleaved split leaks nothing between them. Every document is followed by
``<|endoftext|>``, as in the file and Shakespeare paths (``reslm.data.bpe``); the output format is the
same, so ``TokenDataset`` and training do not know where the tokens came from. ``bpe:K`` is trained on
the training documents, which costs a second pass over the stream.

Nothing downloaded is executed: ``load_dataset`` is called with ``trust_remote_code=False``, so a hub
dataset that needs a loading script is refused (``datasets`` >= 4 has no scripts at all; 2.16 - 3.x
would otherwise ask or run them, older versions would run them silently, hence ``datasets>=2.16``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from reslm.core import progress
from reslm.data.bpe import (
    TokenDataset, _default_name, _encode_text, _import_tokenizers, _write_stream, gpt2_data_files,
    make_tokenizer, parse_spec, text_chunks, token_streams, write_meta,
)
from reslm.data.splits import every_kth
from reslm.data.store import building, check_name, check_target, commit_dataset, default_data_root, logger
from reslm.core.errors import ReslmError

ALIASES = {"openwebtext": "Skylion007/openwebtext"}
_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}


def resolve_source(corpus: str) -> str | None:
    """'openwebtext' / 'hf:NAME' -> the dataset name or local path; None for other corpora."""
    if corpus in ALIASES:
        return ALIASES[corpus]
    if corpus.startswith("hf:") and len(corpus) > 3:
        return corpus[3:]
    return None


def _open_stream(source: str, config: str | None, split: str):
    try:
        import datasets
    except ImportError:
        raise ReslmError("Hugging Face sources need the PyPI package datasets: pip install 'reslm[hf]'") from None
    path = Path(source)
    if path.is_file() and path.stat().st_size == 0:
        raise ReslmError(f"{path} is empty")
    try:
        if path.is_file():
            builder = _BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise ReslmError(f"{path}: unknown data file type {path.suffix!r} "
                                 f"(use {', '.join(sorted(_BUILDERS))} or a folder)")
            return datasets.load_dataset(builder, data_files=str(path), split=split, streaming=True,
                                         trust_remote_code=False)
        return datasets.load_dataset(str(path) if path.is_dir() else source, config, split=split, streaming=True,
                                     trust_remote_code=False)
    except ReslmError:
        raise
    except Exception as e:  # network, unknown dataset, bad split/config: one line for the user
        msg = str(e).strip().splitlines()[0] if str(e).strip() else f"{type(e).__name__} (is it a dataset?)"
        raise ReslmError(f"cannot open the dataset {source!r} (split {split!r}): {msg}") from None


def _documents(stream, text_field: str, max_docs: int | None) -> Iterator[tuple[int, str]]:
    """(index, text) of the first max_docs documents (all when None)."""
    for i, row in enumerate(stream):
        if max_docs is not None and i >= max_docs:
            return
        if text_field not in row:
            raise ReslmError(f"the dataset has no text field {text_field!r} "
                             f"(fields: {', '.join(sorted(row))}); pass --text-field")
        text = row[text_field]
        if not isinstance(text, str):
            raise ReslmError(f"field {text_field!r} of document {i} is not text")
        yield i, text


def prepare_bpe_hf(source: str, tokenizer: str, root: Path | None = None, name: str | None = None,
                   val_fraction: float = 0.01, max_docs: int | None = None, config: str | None = None,
                   split: str = "train", text_field: str = "text", overwrite: bool = False,
                   verbose: bool = True) -> TokenDataset:
    """Encode a (streamed) HF dataset into dataset <root>/<name>; see the module docstring.

    source: a hub name ("Skylion007/openwebtext"), a local folder or a local data file.
    name defaults to "<last part of source>-<tokenizer>", e.g. "openwebtext-gpt2"."""
    parse_spec(tokenizer)
    if not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise ReslmError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    if max_docs is not None and (not isinstance(max_docs, int) or max_docs < 2):
        raise ReslmError(f"max_docs must be an integer >= 2, got {max_docs!r}")
    _import_tokenizers()
    if parse_spec(tokenizer)[0] == "gpt2":
        gpt2_data_files()
    every, is_val = every_kth(val_fraction)   # reslm.data.splits
    root = Path(root) if root is not None else default_data_root()
    label = Path(source.rstrip("/")).stem or "hf"
    name = name if name is not None else _default_name(label, tokenizer)
    check_name(name)
    check_target(root / name, overwrite)
    log = logger(verbose)
    stream = _open_stream(source, config, split)

    def train_texts() -> Iterator[str]:
        for i, text in _documents(stream, text_field, max_docs):
            if not is_val(i):
                yield from text_chunks(text)

    with building(root, name) as tmp:

        tok, tok_meta = make_tokenizer(tokenizer, train_texts, tmp, log, verbose)
        counts, chars, docs = {"train": 0, "val": 0}, {"train": 0, "val": 0}, {"train": 0, "val": 0}
        with token_streams(tmp) as (ftrain, fval), \
                progress.bar(total=max_docs, unit="doc", enabled=verbose, desc="reslm data: encoding") as bar:
            for i, text in _documents(stream, text_field, max_docs):
                part, f = ("val", fval) if is_val(i) else ("train", ftrain)
                counts[part] += _encode_text(text, tok, f) + _write_stream(f, [tok.eot_id])
                chars[part] += len(text)
                docs[part] += 1
                bar.update(1)
        if not docs["train"] or not docs["val"]:
            raise ReslmError(f"too few documents: {docs['train'] + docs['val']} leave an empty train or "
                             f"validation split (every {every}th document is validation)")
        write_meta(tmp, name, tok, tok_meta, counts, {
            "n_chars": chars, "n_docs": docs, "val_fraction": val_fraction,
            "split": {"rule": f"document index i goes to val when (i + 1) % {every} == 0", "every": every},
            "source": {"kind": "hf-datasets", "dataset": source, "config": config, "split": split,
                       "text_field": text_field, "max_docs": max_docs, "streaming": True,
                       "datasets_version": _datasets_version()}})
        path = commit_dataset(tmp, root, name, overwrite)
    log(f"wrote {path}: {tokenizer} (vocab {tok.vocab_size}), {docs['train']:,} + {docs['val']:,} documents, "
        f"train {counts['train']:,} tokens, val {counts['val']:,} tokens")
    return TokenDataset.load(path)


def _datasets_version() -> str:
    import datasets
    return datasets.__version__


__all__ = ["ALIASES", "prepare_bpe_hf", "resolve_source"]
