"""The transformer's layer_init: "copies" starts every layer as a copy of the first (the authors'
nn.TransformerEncoder deep-copies one layer), "independent" (the default, every run so far) draws each."""
import json

import pytest
import torch

from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.models import PRESETS, build_model
from reslm.models.base import count_params
from reslm.models.identity import command, fingerprint, identity, recipe, run_name
from reslm.models.transformer import CharTransformer, TransformerConfig


def _layers(model) -> list[dict]:
    return [layer.state_dict() for layer in model.layers]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_copies_start_every_layer_equal_with_the_same_parameter_count():
    copies = build_model("tf", **PRESETS["tf-256-16-16"][1], layer_init="copies")
    independent = build_model("tf", **PRESETS["tf-256-16-16"][1])
    assert count_params(copies) == count_params(independent) and count_params(copies)[0] == 155_803
    first, *rest = _layers(copies)
    assert len(rest) == 15 and all(_same(first, other) for other in rest)
    first_i, *rest_i = _layers(independent)
    assert not any(_same(first_i, other) for other in rest_i)
    # the same draws up to the first layer: the embedding and layer 0 are the independent model's
    assert torch.equal(copies.embed.weight, independent.embed.weight) and _same(first, first_i)
    # copies, not one shared layer: each trains apart from the first step on
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(copies.layers[0].parameters(),
                                                            copies.layers[1].parameters()))


def test_the_layers_train_apart_and_the_seed_still_fixes_the_start():
    cfg = dict(ff_dim=16, n_heads=2, n_layers=3, layer_init="copies", seed=5)
    a, b = CharTransformer(TransformerConfig(**cfg)), CharTransformer(TransformerConfig(**cfg))
    assert all(_same(x, y) for x, y in zip(_layers(a), _layers(b)))
    a.window_step = "plain"
    opt = torch.optim.Adam(a.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 59, (64, 32), generator=g), torch.randint(0, 59, (64,), generator=g)
    _, loss = a(x, y)
    loss.backward()
    opt.step()
    first, *rest = _layers(a)
    assert not any(_same(first, other) for other in rest)


@pytest.mark.parametrize("bad", ["copy", "", 1])
def test_another_value_is_refused(bad):
    with pytest.raises(ReslmError, match="layer_init must be one of independent, copies"):
        TransformerConfig(layer_init=bad).validate()


def test_an_old_config_reads_as_independent_and_keeps_its_fingerprint():
    """Run configs written before the field read as "independent": the same identity, fingerprint and
    name as before it existed (hard-coded: what the previous reslm gave these configs)."""
    paper = recipe(preset="tf-256-16-16", data="shakespeare")
    old = {**paper, "model": {k: v for k, v in paper["model"].items() if k != "layer_init"}}
    assert "layer_init" not in old["model"] and paper["model"]["layer_init"] == "independent"
    assert identity(old) == identity(paper) and identity(old)["model"]["layer_init"] == "independent"
    assert fingerprint(old) == fingerprint(paper) == "3cd4a546"
    passes = recipe(preset="tf-64-4-4", train=dict(cycles=3, eval_at="shard-after-cycle-1"), data="shakespeare")
    assert run_name(passes, "3c") == "tf-64-4-4-3c-137173d2-s0"
    authors = recipe(preset="tf-256-16-16", model=dict(layer_init="copies"), data="shakespeare")
    assert fingerprint(authors) != fingerprint(paper)
    assert run_name(authors).startswith("tf-256-16-16-")   # still the preset: a size field did not change
    assert "--layer-init copies" in command(authors) and "--layer-init" not in command(paper)


FUSED_CHECK = """
import torch
from reslm.models import window_kernel as wk
from reslm.models.transformer import CharTransformer, TransformerConfig
torch.set_num_threads(1)
model = CharTransformer(TransformerConfig(ff_dim=32, n_heads=2, n_layers=3, layer_init="copies", seed=2)).eval()
if wk.library(model.config) is None:
    print("skip", wk.unsupported(model.config) or wk.native.why_not(wk.SOURCE))
    raise SystemExit
assert wk.fits(model)
x = torch.randint(0, 59, (9, 32), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    fused, _ = wk.fused_forward(model, x)
    model.window_step = "plain"
    plain, _ = model.forward_features(x)
print("diff", (fused - plain).abs().max().item())
"""


def test_the_fused_window_step_reads_the_copied_layers_unchanged():
    """The kernel reads the layers' parameters only: the copies' logits equal the plain path's. In a process of
    its own, where this configuration's kernel is the first one loaded."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FUSED_CHECK], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    word, *rest = done.stdout.split(maxsplit=1)
    if word == "skip":
        pytest.skip(f"no fused kernel here: {rest[0].strip() if rest else ''}")
    assert word == "diff" and float(rest[0]) <= 1e-5


def test_the_flag_of_reslm_train(capsys):
    assert main(["train", "--preset", "tf-64-4-4", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--layer-init STR" in out and "copies (every layer starts as a copy of the first" in out
    assert main(["presets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    tf = [r for r in rows if r["family"] == "tf"]
    assert len(tf) == 6 and all(r["config"]["layer_init"] == "independent" for r in tf)   # the presets as they were
