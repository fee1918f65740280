"""reslm.train.config: what `reslm train` decides before and around the loop (folder, start or resume, owner)."""
import os
from pathlib import Path

import pytest

from reslm.core.errors import ReslmError
from reslm.run import CONFIG, read_config
from reslm.train.config import current_evals, family_and_preset, own_run, run_folder, start_run


def start(out, **kw):
    args = dict(resume=False, preset=None, family=None, model_over={}, train_over={}, data=None, data_root=None)
    return start_run(Path(out), **{**args, **kw})


def test_the_default_folder_is_named_after_the_preset_or_the_family():
    assert run_folder("rc-750", "rc") == Path("runs/rc-750")
    assert run_folder(None, "gpt") == Path("runs/gpt")
    assert run_folder(None, None) == Path("runs/run")


def test_a_preset_gives_its_family_and_its_overrides():
    assert family_and_preset("rc-750", None) == ("rc", {"size": 750})
    assert family_and_preset("rc-750", "rc") == ("rc", {"size": 750})
    assert family_and_preset(None, "tf") == ("tf", {})
    with pytest.raises(ReslmError, match="preset rc-750 is family rc, not aerc"):
        family_and_preset("rc-750", "aerc")
    with pytest.raises(ReslmError, match="give --preset NAME"):
        family_and_preset(None, None)


def test_a_run_is_started_once_and_resumed_with_its_saved_config(chars, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ReslmError, match="holds no run to resume"):
        start(out, resume=True)
    fresh, notes = start(out, preset="rc-750", model_over={"size": 8}, data=str(chars.path))
    assert (fresh, notes) == (True, [])
    cfg = read_config(out)
    assert (cfg["family"], cfg["preset"], cfg["model"]["size"]) == ("rc", "rc-750", 8)
    with pytest.raises(ReslmError, match="already holds a run"):
        start(out, preset="rc-750", data=str(chars.path))
    assert start(out, resume=True) == (False, [])
    fresh, notes = start(out, resume=True, family="rc", model_over={"size": 16})
    assert not fresh and notes == [f"resuming {out} with its saved config (other flags ignored)"]
    assert read_config(out)["model"]["size"] == 8


def test_only_rank_zero_owns_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with own_run(tmp_path / "a"):
        pass
    assert not os.path.lexists(tmp_path / "a")   # no lock, no folder: rank 0 makes it
    monkeypatch.setenv("RANK", "0")
    with own_run(tmp_path / "b"):
        assert (tmp_path / "b").is_dir()


def test_a_resumed_run_drops_evaluations_older_than_its_checkpoint(tmp_path):
    (tmp_path / CONFIG).write_text("{}")
    (tmp_path / "eval.json").write_text("{}")
    (tmp_path / "checkpoint.pt").write_text("")
    os.utime(tmp_path / "eval.json", (1, 1))
    with current_evals(tmp_path, fresh=True):
        assert (tmp_path / "eval.json").exists()
    with current_evals(tmp_path, fresh=False):
        assert not (tmp_path / "eval.json").exists()
