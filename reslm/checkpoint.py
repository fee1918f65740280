"""Loading a trained run back: the model with its weights, and the codec that turns text into ids."""
from __future__ import annotations

from pathlib import Path

from reslm.errors import ReslmError
from reslm.run import load_checkpoint, read_config


class CharCodec:
    """Text <-> ids for a character-level run (its vocabulary is saved in config.json)."""

    def __init__(self, vocab: list[str]):
        self.vocab = vocab
        self.lookup = {c: i for i, c in enumerate(vocab)}
        self.lowercase = all(c == c.lower() for c in vocab)

    def encode(self, text: str) -> list[int]:
        text = text.lower() if self.lowercase else text
        bad = sorted({c for c in text if c not in self.lookup})
        if bad:
            raise ReslmError(f"prompt has characters outside the vocabulary: {''.join(bad)!r}")
        return [self.lookup[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)


def load_run(run_dir: Path, device="cpu"):
    """(model in eval mode with the last checkpoint's weights, codec with encode/decode, run config)."""
    cfg = read_config(run_dir)
    ck = load_checkpoint(run_dir, map_location=device)
    if ck is None:
        raise ReslmError(f"{run_dir} has no checkpoint yet (train it first)")
    from reslm.train_tokens import FAMILIES as TOKEN_FAMILIES
    if cfg["family"] in TOKEN_FAMILIES:
        from reslm.data.bpe import TokenDataset
        from reslm.train_tokens import build_token_model
        model = build_token_model(cfg["family"], cfg["model"]).to(device)
        codec = TokenDataset.load(cfg["data"]["path"]).tokenizer()
    else:
        from reslm.train import load_model
        model = load_model(cfg, device)
        codec = CharCodec(cfg["data"]["vocab"])
    try:
        model.load_state_dict(ck["model"])
    except (RuntimeError, KeyError) as e:
        raise ReslmError(f"checkpoint in {run_dir} does not match its config: {str(e).splitlines()[0]}") from None
    return model.eval(), codec, cfg
