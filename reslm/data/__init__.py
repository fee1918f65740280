"""Corpus -> tokens: obtaining text and turning it into datasets.

``reslm.data.store`` is the one on-disk format (tokens.bin + meta.json, shards as views) and its
fingerprints; ``reslm.data.tokenizer`` the one tokenizer interface (characters and byte-level BPE);
``reslm.data.chars`` the character datasets (vocabulary rule, sharding), ``reslm.data.bpe`` and
``reslm.data.hf`` the BPE ones; ``reslm.data.corpus`` fetches and groups the Shakespeare corpus;
``reslm.data.splits`` carves every split (test shard, val view, a run's held-out tails or groups).
"""

from reslm.data.chars import (
    SHAKESPEARE_MIN_CHAR_COUNT,
    TEXT_MIN_CHAR_COUNT,
    CharDataset,
    check_fingerprint,
    default_data_root,
    prepare_shakespeare,
    prepare_text,
    resolve_dataset,
)
from reslm.data.corpus import PLAY_ALIASES, default_cache_dir, fetch_shakespeare, play_key
from reslm.data.splits import DEFAULT_N_SHARDS, MIN_SHARD_CHARS, plan_shards

__all__ = [
    "CharDataset",
    "DEFAULT_N_SHARDS",
    "MIN_SHARD_CHARS",
    "PLAY_ALIASES",
    "check_fingerprint",
    "SHAKESPEARE_MIN_CHAR_COUNT",
    "TEXT_MIN_CHAR_COUNT",
    "default_cache_dir",
    "default_data_root",
    "fetch_shakespeare",
    "plan_shards",
    "play_key",
    "prepare_shakespeare",
    "prepare_text",
    "resolve_dataset",
]
