"""States/tokens -> logits: the model families, their registry and the paper's presets.

    registry.py   MODELS (family -> config, model, data kind, training defaults) and PRESETS (Table 1's
                  fifteen, then the frontier's ceilings): every other list of families derives from them
    resolve.py    a configuration resolved once: make_config, build_model, ModelSpec (resolve)

This face hands their names on, and draws the presets' table (`reslm presets`).
"""
from __future__ import annotations

from reslm.models.base import count_params
from reslm.models.registry import MODELS, PRESETS, Family, families, family, preset
from reslm.models.resolve import ModelSpec, build_model, check_frontier_config, complete_fields, make_config


def preset_table() -> list[dict]:
    """One row per preset: name, family, trainable/fixed parameter counts (measured on a shape-only
    model on the meta device, so no random matrices are drawn), the paper's count, whether it obeys the
    reservoir frontier's rules (reslm.models.budget), the config."""
    rows = []
    for name, (fam, overrides, paper) in PRESETS.items():
        spec = ModelSpec(fam, make_config(fam, **overrides), name)
        trainable, fixed = count_params(spec.shape)
        rows.append(dict(name=name, family=fam, trainable_params=trainable, fixed_params=fixed,
                         paper_trainable_params=paper, frontier=spec.frontier.ok, config=spec.fields))
    return rows


def preset_text(rows: list[dict]) -> str:
    """preset_table's rows as `reslm presets` prints them: one line per preset under a header."""
    lines = [f"{'name':<20}{'family':<7}{'trainable':>10}{'paper':>9}{'fixed':>10}  frontier"]
    for r in rows:
        paper = f"{r['paper_trainable_params']:,}" if r["paper_trainable_params"] else "-"
        lines.append(f"{r['name']:<20}{r['family']:<7}{r['trainable_params']:>10,}{paper:>9}"
                     f"{r['fixed_params']:>10,}  {'yes' if r['frontier'] else 'no'}")
    return "\n".join(lines)


__all__ = ["MODELS", "PRESETS", "Family", "ModelSpec", "build_model", "check_frontier_config", "complete_fields",
           "families", "family", "make_config", "preset", "preset_table", "preset_text"]
