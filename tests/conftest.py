"""Test-wide settings. The tests use tiny models, which gain nothing from intra-op threads; one
thread also keeps them fast when another process is busy on the same cores (OpenMP worker threads
otherwise spin-wait for each other). Memory claims between trainings stay within each test process. The
tests never use the network: the Hugging Face libraries are put in offline mode before anything imports
them (they read these variables at import time)."""
import atexit
import os
import random
import shutil
import tempfile

import pytest
import torch

torch.set_num_threads(1)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# memory claims between trainings (reslm.core.claims): each test process its own, apart from the machine's
os.environ["RESLM_CLAIMS"] = tempfile.mkdtemp(prefix="reslm-claims-")
atexit.register(shutil.rmtree, os.environ["RESLM_CLAIMS"], True)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A tiny BPE dataset (bpe:300 over a made-up corpus) for the token-level training tests."""
    from reslm.data.bpe import prepare_bpe
    pytest.importorskip("tokenizers")
    root = tmp_path_factory.mktemp("tok")
    rng = random.Random(0)
    words = "the cat sat on a mat and the dog ran to the red door while birds sang".split()
    text = "\n".join(" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(400))
    f = root / "corpus.txt"
    f.write_text(text)
    return prepare_bpe([f], "bpe:300", root=root, val_fraction=0.1, verbose=False)


@pytest.fixture(scope="module")
def chars(tmp_path_factory):
    """A tiny character dataset (six shards of ~1.2k characters) for the training and evaluation tests."""
    from reslm.data import prepare_text
    root = tmp_path_factory.mktemp("chars")
    rng = random.Random(0)
    words = "to be or not that is the question whether tis nobler in mind".split()
    (root / "a.txt").write_text(" ".join(rng.choice(words) for _ in range(1500)))
    return prepare_text([root / "a.txt"], root, name="tiny", verbose=False)


@pytest.fixture
def registry():
    """reslm.reservoir.RESERVOIRS, put back as it was after the test (an --import file registers into it), and
    with it SOURCES (the files run for --import, reslm.reservoir.registry)."""
    from reslm.reservoir import RESERVOIRS
    from reslm.reservoir.registry import SOURCES
    saved, sources = dict(RESERVOIRS), dict(SOURCES)
    yield RESERVOIRS
    RESERVOIRS.clear()
    RESERVOIRS.update(saved)
    SOURCES.clear()
    SOURCES.update(sources)


@pytest.fixture
def error_line(capsys):
    """A reader of the one line a refused command printed: exactly one non-empty stderr line, reslm's own
    ("reslm: error: ..."), no traceback; returns it."""
    def read() -> str:
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("reslm: error: ") and "Traceback" not in err, err
        return lines[0]
    return read
