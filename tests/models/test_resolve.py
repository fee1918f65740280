"""reslm.models.resolve: a model configuration resolved once (ModelSpec), and what it answers."""
import pytest
import torch

from reslm.core.errors import ReslmError
from reslm.models import build_model, count_params, make_config
from reslm.models.base import config_dict
from reslm.models.budget import check_frontier
from reslm.models.resolve import CHAR_VOCAB, resolve


def test_a_preset_resolves_to_its_family_values_at_the_character_vocabulary():
    spec = resolve(preset="rc-750")
    assert spec.family == "rc" and spec.preset == "rc-750"
    assert spec.config.size == 750 and spec.config.vocab_size == CHAR_VOCAB
    assert spec.fields == config_dict(make_config("rc", size=750, vocab_size=CHAR_VOCAB))


def test_its_answers_are_those_of_the_model_it_describes():
    spec = resolve("rc", {"size": 40, "head": "mlp", "head_hidden": 8}, vocab_size=11)
    model = build_model("rc", spec.config)
    assert spec.frontier.trainable_params == count_params(model)[0] == check_frontier(model).trainable_params
    assert spec.bytes == sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    assert all(t.device.type == "meta" for t in spec.shape.parameters())   # nothing drawn for the answers
    assert spec.shape is spec.shape                                         # built once


def test_replace_resolves_anew_and_leaves_the_spec_as_it_was():
    spec = resolve("rc", {"size": 40, "head": "mlp", "head_hidden": 8})
    wider = spec.replace(head_hidden=16)
    assert wider.config.head_hidden == 16 and spec.config.head_hidden == 8
    assert wider.frontier.trainable_params > spec.frontier.trainable_params


@pytest.mark.parametrize("args, kw, words", [
    ((), dict(preset="rc-9"), "unknown preset"),
    (("nope",), {}, "unknown model family"),
    (("rc", {"sizes": 3}), {}, "unknown rc option"),
    (("rc", {"size": "big"}), {}, "must be an integer"),
    ((), {}, "names a preset or a family"),
])
def test_what_cannot_be_resolved_is_one_line(args, kw, words):
    with pytest.raises(ReslmError, match=words):
        resolve(*args, **kw)


def test_check_fits_reads_the_specs_bytes(monkeypatch):
    import reslm.core.device as device
    import reslm.models.load as load
    monkeypatch.setattr(device, "memory_limit", lambda: 1000)      # the one rule's (reslm.core.device.check_memory)
    monkeypatch.setattr(device, "available_memory", lambda device: None)
    with pytest.raises(ReslmError, match="give a smaller --size"):
        load.check_fits(resolve("rc", {"size": 64}))
    monkeypatch.setattr(device, "memory_limit", lambda: 10 ** 12)
    load.check_fits(resolve("rc", {"size": 64}))
    assert torch.get_default_device().type == "cpu"
