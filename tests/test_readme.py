"""README.md is the product page a new user reads first: its Python example must run as written,
it stays small, and every docs/ page it links to exists.

The example reads `./data/shakespeare` (what `reslm data shakespeare` writes); here that name is a
tiny in-test corpus in a temporary working folder, so the example runs in seconds and offline."""
import math
import random
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_BYTES = 15 * 1024


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_is_at_most_15_kb():
    size = README.stat().st_size
    assert size <= MAX_BYTES, f"README.md is {size:,} bytes, over {MAX_BYTES:,}: move detail into docs/"


def test_every_local_link_in_the_readme_exists():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in local), "the README links no docs/ page"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_docs_pages_link_only_to_existing_files():
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"[a-z]+:", target):
                assert (page.parent / target).exists(), f"{page.name} links to a missing file: {target}"


def test_the_results_table_has_one_row_per_table1_preset_beside_the_papers_figure():
    """The README's results: one row per Table 1 preset (reslm.models.PRESETS with the paper's count), in the
    window or stream context, the paper's figure (reslm.paper) beside the test CE, bits/char and a link to
    the weights where they are published; the trained ceilings in one line under the table. Every other row
    is in docs/results.md, which the README links."""
    from reslm.models import PRESETS
    from reslm.paper import LARGEST, TEST_CE
    text = README.read_text()
    block = text.split("<!-- results:begin -->")[1].split("<!-- results:end -->")[0]
    lines = [line for line in block.splitlines() if line.startswith("| ")]
    assert lines[0] == "| preset | trainable | context | test CE (nats) | paper | bits/char | weights |"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]
    table1 = [name for name, (_, _, count) in PRESETS.items() if count is not None]
    assert [r[0] for r in rows] == table1, "one row per Table 1 preset, in Table 1's order"
    paper = {name: f"{TEST_CE[family]:.2f}" for family, name in LARGEST.items()}
    for name, trainable, context, ce, fig, bits, weights in rows:
        assert int(trainable.replace(",", "")) == PRESETS[name][2], name
        assert context in ("window", "stream"), name
        assert fig == paper.get(name, "-"), name
        assert ce == "..." or abs(float(bits.split()[0]) - float(ce) / math.log(2)) < 1e-3, name
        link = re.fullmatch(r"\[(results/[^]]+)\]\(\1\)( \(in progress\))?", weights)
        assert link or weights == "not published", (name, weights)
        assert not link or (ROOT / link.group(1) / "manifest.json").is_file(), name
    ceilings = [line for line in block.splitlines() if line.startswith("Trained ceilings")]
    assert len(ceilings) == 1 and "[rnn-gru-32-200](results/" in ceilings[0] and "[rnn-lstm-32-173](" in ceilings[0]
    assert "[docs/results.md](docs/results.md)" in text


def test_the_readme_has_one_short_python_example():
    blocks = python_blocks(README.read_text())
    assert len(blocks) == 1, "the README should hold exactly one ```python example (the one this test runs)"
    lines = [line for line in blocks[0].splitlines() if line.strip()]
    assert 10 <= len(lines) <= 25, f"the example has {len(lines)} lines (10-25 wanted)"


def test_the_readme_test_command_is_what_ci_runs():
    assert "make test" in README.read_text()
    assert "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.fixture
def shakespeare_here(tmp_path, monkeypatch):
    """A working folder whose ./data/shakespeare is a tiny corpus (six shards of ~3k characters)."""
    from reslm.data import prepare_text
    rng = random.Random(0)
    words = "to be, or not that is the question: whether tis nobler in the mind to suffer".split()
    src = tmp_path / "corpus.txt"
    src.write_text(" ".join(rng.choice(words) for _ in range(3500)))
    prepare_text([src], tmp_path / "data", name="shakespeare", verbose=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RESLM_DATA", raising=False)
    return tmp_path


def test_the_python_example_runs_as_written(shakespeare_here, capsys):
    from reslm import reservoir
    code = python_blocks(README.read_text())[0]
    registry = dict(reservoir.RESERVOIRS)
    try:
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    finally:  # the example registers its own substrate; other tests see the registry as it was
        reservoir.RESERVOIRS.clear()
        reservoir.RESERVOIRS.update(registry)
    out = capsys.readouterr().out
    assert re.search(r"test CE \d+\.\d+ nats", out), out
    run = shakespeare_here / "runs" / "aerc-ring"
    for name in ("config.json", "metrics.jsonl", "summary.json", "eval.json"):
        assert (run / name).is_file(), name
