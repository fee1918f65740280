"""The former name of reslm.run.load, kept for code written against it (the README's example among
it): the same functions, nothing of its own. New code imports reslm.run.load (and SUMMARY from
reslm.run, read_json from reslm.files)."""
from reslm.files import read_json
from reslm.run import SUMMARY
from reslm.run.load import (BUILDABLE, CharCodec, check_dataset, codec_of, data_kind, describe_dataset, find_dataset,
                            load_model, load_run, open_dataset)

__all__ = ["BUILDABLE", "SUMMARY", "CharCodec", "check_dataset", "codec_of", "data_kind", "describe_dataset",
           "find_dataset", "load_model", "load_run", "open_dataset", "read_json"]
