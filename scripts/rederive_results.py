"""Re-derive the published folders in results/ to the issue-32 form, changing no number.

    .venv/bin/python scripts/rederive_results.py [results/NAME ...]   (default: every published folder)

For each published folder, after checking it as it stands (reslm.run.registry.verify_published):
    config.json    data.path becomes the dataset's name (reslm.publish.published_config): the path of the
                   machine that trained it meant nothing in a clone; reslm finds the dataset by name
    eval.json      "run" becomes the folder's name (it held the evaluating machine's path)
    manifest.json  the new sha256 of those two files, and "radii": the spectral radius of each reservoir
                   draw, so that loading the run skips the eigendecomposition. The radius is computed
                   here once, and the matrix it rebuilds is checked against the manifest's fingerprint of
                   that matrix before it is recorded (the same bytes as before, or nothing is written).
Every other file, and every number in these, is left as it is. Files are rewritten atomically, the
manifest last; running it again changes nothing. `reslm report --check` must still say "up to date".
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from reslm.core.files import read_json, sha256_file, write_json
from reslm.models.load import load_model
from reslm.publish import published_config
from reslm.reservoir import model_radii
from reslm.run import CONFIG, read_config
from reslm.run.registry import EVAL, MANIFEST, check_fixed, is_published, verify_published


def rederive(folder: Path) -> list[str]:
    """Bring one published folder to the current form; returns the names of the files it changed."""
    manifest = verify_published(folder)
    cfg = read_config(folder)
    changed = []
    new_cfg = published_config(cfg)
    if new_cfg != cfg:
        write_json(folder / CONFIG, new_cfg)
        changed.append(CONFIG)
    evaluation = read_json(folder / EVAL)
    if evaluation is not None and evaluation.get("run") != folder.name:
        write_json(folder / EVAL, {**evaluation, "run": folder.name})
        changed.append(EVAL)
    model = load_model(new_cfg, "cpu")            # computes each radius once, as training did
    check_fixed(folder, model, manifest)          # the rebuilt matrices are the published ones
    radii = model_radii(model)
    files = {n: sha256_file(folder / n) for n in manifest["files"]}
    if files != manifest["files"] or manifest.get("radii") != radii:
        write_json(folder / MANIFEST, {**manifest, "files": dict(sorted(files.items())), "radii": radii})
        changed.append(MANIFEST)
    verify_published(folder)
    return changed


def main(argv: list[str]) -> int:
    folders = [Path(a) for a in argv] or sorted(p for p in Path("results").iterdir() if p.is_dir() and is_published(p))
    for folder in folders:
        changed = rederive(folder)
        print(f"{folder}: {', '.join(changed) if changed else 'unchanged'}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
