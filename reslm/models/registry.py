"""The model families' registry and the paper's presets.

MODELS maps a family name to a `Family`: its config class, its model class, the kind of data it reads
("chars": the sharded character datasets of `reslm data shakespeare|text`; "tokens": the BPE datasets
of `reslm data bpe`) and the training defaults that differ from TrainConfig's (reslm.settings' CHAR_TRAIN
and TOKEN_TRAIN). Every other list of families (the CLI's, reproduce's, the sweep's) derives from it.

PRESETS maps a preset name to its family, config overrides and the paper's trainable count: Table 1's
fifteen, then the reservoir frontier's ceilings (fully trained networks of at most 155,459 parameters,
paper count None: docs/frontier.md), which `reslm reproduce` does not train unless named.
"""
from __future__ import annotations

from typing import NamedTuple

from reslm.core.errors import ReslmError
from reslm.models.aerc import AERC, AERCConfig
from reslm.models.gpt import GPT, GPTConfig
from reslm.models.laerc import LAERC, LAERCConfig
from reslm.models.rc import RC, RCConfig
from reslm.models.rnn import CharRNN, RNNConfig
from reslm.models.transformer import CharTransformer, TransformerConfig
from reslm.settings import CHAR_TRAIN, TOKEN_TRAIN


class Family(NamedTuple):
    config: type          # the config dataclass
    model: type           # the nn.Module built from it
    data: str             # "chars" | "tokens"
    train: dict           # training defaults for this family (overrides of TrainConfig's: reslm.settings)
    help: str             # one line for --help


MODELS: dict[str, Family] = {
    "rc": Family(RCConfig, RC, "chars", CHAR_TRAIN, "classic reservoir: fixed ESN, trained linear readout"),
    "aerc": Family(AERCConfig, AERC, "chars", CHAR_TRAIN, "attention-enhanced reservoir: readout generated per step"),
    "tf": Family(TransformerConfig, CharTransformer, "chars", CHAR_TRAIN, "character transformer over a 32-char window"),
    "rnn": Family(RNNConfig, CharRNN, "chars", CHAR_TRAIN, "trained GRU/LSTM over a 32-char window (frontier ceiling)"),
    "laerc": Family(LAERCConfig, LAERC, "tokens", TOKEN_TRAIN, "layered reservoir LM (Appendix A), BPE tokens"),
    "gpt": Family(GPTConfig, GPT, "tokens", TOKEN_TRAIN, "causal transformer baseline, BPE tokens"),
}


def families(data: str | None = None) -> tuple[str, ...]:
    """Family names, all or those reading `data` ("chars" | "tokens"), in registry order."""
    return tuple(name for name, f in MODELS.items() if data is None or f.data == data)


def family(name: str) -> Family:
    if name not in MODELS:
        raise ReslmError(f"unknown model family {name!r} (known: {', '.join(MODELS)})")
    return MODELS[name]


# Table 1 of the paper (vocabulary 59, embedding 16), with the trainable-parameter count it reports.
PRESETS: dict[str, tuple[str, dict, int | None]] = {}
for _n, _p in [(250, 14809), (500, 29559), (750, 44309), (1750, 103309), (2600, 153459)]:
    PRESETS[f"rc-{_n}"] = ("rc", dict(size=_n), _p)
for (_n, _h), _p in zip([(75, 13), (75, 19), (100, 20), (150, 25), (160, 30)],
                        [15464, 31124, 45259, 102809, 155459]):
    PRESETS[f"aerc-{_n}-{_h}"] = ("aerc", dict(size=_n, hidden=_h), _p)
for (_f, _h, _l), _p in zip([(64, 4, 4), (72, 8, 8), (128, 8, 8), (356, 8, 8), (256, 16, 16)],
                            [15067, 30299, 45083, 105275, 155803]):
    PRESETS[f"tf-{_f}-{_h}-{_l}"] = ("tf", dict(ff_dim=_f, n_heads=_h, n_layers=_l), _p)
# The frontier's ceilings at <= 155,459 trainable parameters (not in the paper): a GRU and an LSTM reading
# the same 32-char windows (154,147 and 155,398), and a transformer with a 64-wide embedding instead of 16
# (149,755), each trained by the same loop on the same schedule.
PRESETS["rnn-gru-32-200"] = ("rnn", dict(cell="gru", embed_dim=32, hidden=200), None)
PRESETS["rnn-lstm-32-173"] = ("rnn", dict(cell="lstm", embed_dim=32, hidden=173), None)
PRESETS["tf-e64-144-4-4"] = ("tf", dict(embed_dim=64, ff_dim=144, n_heads=4, n_layers=4), None)


def preset(name: str) -> tuple[str, dict]:
    if name not in PRESETS:
        raise ReslmError(f"unknown preset {name!r} (see `reslm presets`)")
    fam, cfg, _ = PRESETS[name]
    return fam, dict(cfg)


__all__ = ["Family", "MODELS", "PRESETS", "families", "family", "preset"]
