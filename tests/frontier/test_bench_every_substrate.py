"""`reslm frontier bench` takes each substrate's own settings (issue 74): every registered substrate runs
through it at a tiny budget (a tiny recipe on a tiny corpus made in the test, in place of the esn-lr plan's
choice), the recipe's ESN values go with the ESN only, and `--set` gives a substrate its operating point."""

import pytest

from reslm.cli import main
from reslm.frontier import bench as fbench
from reslm.frontier.plan import Config
from reslm.recording import export_drive, import_states, simulate
from reslm.reservoir import RESERVOIRS
from reslm.run import read_config

N = 32
# a recipe whose reservoir values were tuned for the ESN, as the esn-lr plan's are
RECIPE = f"""
[plan]
about = "a tiny recipe for the bench"

[base]
label = "tiny-recipe"
family = "rc"
data = "tiny"
model = {{ size = {N}, streams = 1, context_mode = "stream", spectral_radius = 1.1111, input_scaling = 1.1111, reservoir_options = "input_init=normal" }}
train = {{ batch_size = 64, epochs_per_shard = 1, epoch_samples = 128, shard_chars = 0, lr = 3e-3, val_fraction = 0.2, eval_samples = 0 }}

[rule]
seeds = [0]
"""
# what a substrate needs beyond the recipe: nvar's size is its feature count (1 + k d + k d (k d + 1) / 2)
EXTRA = {"nvar": ["--reservoir-options", "k=1", "--size", "153"]}


@pytest.fixture
def bench_flags(bench_on):
    """The flags of a bench on this file's tiny recipe (conftest.bench_on)."""
    return bench_on(RECIPE)


@pytest.fixture
def recording(chars, tmp_path):
    """A tiny recorded substrate: the ESN simulated as a device, its states imported."""
    export_drive(chars, tmp_path / "drive", embed_dim=16, seed=0)
    simulate(tmp_path / "drive", tmp_path / "states.npy", reservoir="esn", size=N)
    import_states(tmp_path / "states.npy", tmp_path / "drive", tmp_path / "sub")
    return tmp_path / "sub"


def own_row(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| **{name}**"))


def only_run(folder):
    return next(p for p in folder.iterdir() if p.is_dir())


@pytest.mark.parametrize("name", sorted(RESERVOIRS))
def test_every_registered_substrate_runs_through_the_bench(name, bench_flags, tmp_path, capsys, request):
    """Each substrate reslm registers trains at the quick budget with its table row; any other than the ESN
    at its own registered defaults, not the ESN recipe's tuned values."""
    extra = EXTRA.get(name, [])
    if name == "recorded":
        extra = ["--reservoir-options", f"path={request.getfixturevalue('recording')}"]
    assert main(["frontier", "bench", "--reservoir", name, *extra, *bench_flags(name)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    row = own_row(out, name)
    assert "| quick |" in row and "(1)" in row
    model = read_config(only_run(tmp_path / name))["model"]
    own = RESERVOIRS[name][0].__dataclass_fields__
    if name == "esn":
        assert model["spectral_radius"] == 1.1111 and "input_init=normal" in model["reservoir_options"]
        assert "spectral_radius=1.1111" in row
    else:
        assert "input_init=normal" not in model["reservoir_options"]
        for knob in ("spectral_radius", "input_scaling"):
            if knob in own:
                assert model[knob] == own[knob].default and f"{knob}={own[knob].default:g}" in row
        card = (tmp_path / name / "card.md").read_text()
        assert "are not applied to" in card and "its own defaults" in card


def test_set_gives_a_substrate_its_operating_point(bench_flags, tmp_path, capsys):
    """The issue's case: diagonal at spectral_radius 0.95 and input_scaling 0.5, recorded in the config, the
    fingerprint and the folder name, and shown in the table."""
    assert main(["frontier", "bench", "--reservoir", "diagonal", "--set", "spectral_radius=0.95,input_scaling=0.5",
                 *bench_flags("set")]) == 0
    row = own_row(capsys.readouterr().out, "diagonal")
    assert "spectral_radius=0.95" in row and "input_scaling=0.5" in row
    run = only_run(tmp_path / "set")
    model = read_config(run)["model"]
    assert model["spectral_radius"] == 0.95 and model["input_scaling"] == 0.5
    base = fbench.recipe_config()
    plain, _, _ = fbench.bench_config("diagonal", base)
    assert run.name != plain.name(0) and run.name.startswith("rc-diagonal-quick-")
    assert "spectral_radius=0.95" in (tmp_path / "set" / "card.md").read_text()


@pytest.mark.parametrize("argv, words", [
    (["--set", "colour=3"], "--set colour: the rc model has no such field"),
    (["--set", "spectral_radius=high"], "--set spectral_radius='high' is not a valid float"),
    (["--set", "size=64"], "--set size: give it with --size"),
    (["--set", "reservoir=esn"], "--set reservoir: give it with --reservoir"),
    (["--set", "spectral_radius"], "is not field=value"),
    (["--set", "spectral_radius=1.5"], "--set KEY=VALUE"),                          # diagonal refuses it
    (["--reservoir-options", "spectral_radius=0.999"], "give it with --set KEY=VALUE"),
])
def test_a_bad_setting_is_one_line_naming_the_flag(bench_flags, tmp_path, capsys, argv, words):
    assert main(["frontier", "bench", "--reservoir", "diagonal", *argv, *bench_flags("bad")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "bad").exists()


def test_nvar_without_its_size_names_the_flag(bench_flags, tmp_path, capsys):
    assert main(["frontier", "bench", "--reservoir", "nvar", *bench_flags("nvar")]) == 2
    err = capsys.readouterr().err
    assert "give --size 561" in err and not (tmp_path / "nvar").exists()


def test_the_genuine_esn_bench_keeps_its_name(tmp_path):
    """The ESN in the published recipe is benched as before: the recipe's values, the same folder name."""
    base = fbench.recipe_config("esn-lr", tmp_path / "results")
    cfg, notes, _ = fbench.bench_config("esn", base)
    assert cfg.model == {**base.model, "reservoir": "esn"} and not notes
    same = Config(**{**base.__dict__, "label": "esn-quick", "train": {**base.train, **fbench.QUICK}})
    assert cfg.name(0) == same.name(0)   # the recipe at the quick budget, nothing else changed
