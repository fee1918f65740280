"""Stage 1, corpus -> tokens: obtaining text and turning it into character-level datasets.

See ``reslm.data.chars`` for the vocabulary, sharding and on-disk rules and
``reslm.data.corpus`` for how the Shakespeare corpus is fetched and grouped.
"""

from reslm.data.chars import (
    DEFAULT_N_SHARDS,
    MIN_SHARD_CHARS,
    SHAKESPEARE_MIN_CHAR_COUNT,
    TEXT_MIN_CHAR_COUNT,
    CharDataset,
    check_fingerprint,
    default_data_root,
    plan_shards,
    prepare_shakespeare,
    prepare_text,
    resolve_dataset,
)
from reslm.data.corpus import PLAY_ALIASES, default_cache_dir, fetch_shakespeare, play_key

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
