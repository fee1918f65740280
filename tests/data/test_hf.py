"""The Hugging Face `datasets` path (OpenWebText for users online), run against local data: no network."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("datasets")

from reslm.cli import main  # noqa: E402
from reslm.data.bpe import EOT, TokenDataset  # noqa: E402
from reslm.data.hf import prepare_bpe_hf, resolve_source  # noqa: E402
from reslm.core.errors import ReslmError  # noqa: E402


def docs(n: int) -> list[str]:
    return [f"Page {i}. " + " ".join(f"word{(i * 7 + j) % 50} and more text" for j in range(40)) + "\n"
            for i in range(n)]


@pytest.fixture
def jsonl_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "owt"
    folder.mkdir()
    texts = docs(25)
    for part in range(2):  # two data files, read in order
        with open(folder / f"part{part}.jsonl", "w", encoding="utf-8") as f:
            for i in range(part * 13, min(25, part * 13 + 13)):
                f.write(json.dumps({"id": i, "text": texts[i]}) + "\n")
    return folder


def test_resolve_source() -> None:
    assert resolve_source("openwebtext") == "Skylion007/openwebtext"
    assert resolve_source("hf:org/name") == "org/name"
    assert resolve_source("shakespeare") is None and resolve_source("hf:") is None


def test_streamed_folder_split_and_doc_limit(jsonl_dir: Path, tmp_path: Path) -> None:
    ds = prepare_bpe_hf(str(jsonl_dir), "bpe:300", tmp_path / "data", name="owt", val_fraction=0.25,
                        max_docs=20, verbose=False)
    meta = ds.meta
    assert meta["n_docs"] == {"train": 15, "val": 5}  # docs 3, 7, 11, 15, 19 are every 4th
    assert meta["source"]["kind"] == "hf-datasets" and meta["source"]["max_docs"] == 20
    tok = ds.tokenizer()
    texts = docs(20)
    want_val = "".join(texts[i] + EOT for i in range(20) if (i + 1) % 4 == 0)
    want_train = "".join(texts[i] + EOT for i in range(20) if (i + 1) % 4)
    assert tok.decode(np.asarray(ds.val)) == want_val
    assert tok.decode(np.asarray(ds.train)) == want_train
    assert isinstance(TokenDataset.load(ds.path), TokenDataset)


def test_single_file_through_the_cli(jsonl_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = tmp_path / "data"
    rc = main(["data", "bpe", "--corpus", f"hf:{jsonl_dir / 'part0.jsonl'}", "--tokenizer", "bpe:300",
               "--root", str(root), "--val-fraction", "0.2", "--name", "one"])
    assert rc in (0, None)
    ds = TokenDataset.load(root / "one")
    assert ds.meta["n_docs"] == {"train": 11, "val": 2}


def test_bad_sources(jsonl_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    with pytest.raises(ReslmError, match="no text field 'body'"):
        prepare_bpe_hf(str(jsonl_dir), "bpe:300", root, name="x", text_field="body", verbose=False)
    with pytest.raises(ReslmError, match="too few documents"):
        prepare_bpe_hf(str(jsonl_dir), "bpe:300", root, name="x", max_docs=3, val_fraction=0.1, verbose=False)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ReslmError, match="is empty"):
        prepare_bpe_hf(str(empty), "bpe:300", root, name="x", verbose=False)
    odd = tmp_path / "data.xyz"
    odd.write_text("x")
    with pytest.raises(ReslmError, match="unknown data file type"):
        prepare_bpe_hf(str(odd), "bpe:300", root, name="x", verbose=False)
    with pytest.raises(ReslmError, match="cannot open the dataset"):
        prepare_bpe_hf("no-such-org/no-such-dataset", "bpe:300", root, name="x", verbose=False)
    assert not root.exists() or not any(root.iterdir())  # nothing half-written


def test_cli_bad_source_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main(["data", "bpe", "--corpus", "hf:no-such-org/no-such-dataset", "--tokenizer", "bpe:300",
               "--root", str(tmp_path / "data")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("reslm: error: cannot open the dataset")
