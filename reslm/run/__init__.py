"""The run directory: the interface between training, generation, evaluation and reports.

    RUN_DIR/config.json      resolved config: family, preset, model fields, train fields, data, versions
    RUN_DIR/metrics.jsonl    one JSON row per logged step ("kind": "step"), per evaluation ("eval":
                             after each shard-epoch or every eval_every steps), per shard's reservoir
                             precomputation ("states"), per alpha or L2 penalty a solver tried
                             ("ridge", "lbfgs"), and a keep_best_val run's kept weights scored at
                             the end ("weights")
    RUN_DIR/checkpoint.pt    model + optimizer + grad scaler + schedule position, the identity of the
                             run it belongs to and a sha256 checksum over all of it
    RUN_DIR/summary.json     written by train at the end (write_json)
    RUN_DIR/.lock            who holds the run (lock_run flocks the run folder itself and this file); it may stay
    RUN_DIR/reservoir-source.json, reservoir-source.txt   a run whose reservoir a user's file registered
                             (`--import FILE.py`): the file's name and sha256, and a copy of it for reading

One package writes and reads these files, side by side, by job:

    reslm.core.files         (below it) atomic writes, fsync, strict JSON: every file here goes through them
    reslm.run.folder         the file names, config.json (create_run_dir, read_config), metrics.jsonl
                             (MetricsLog, read_metrics), is_finished, schedule_key
    reslm.run.lock           lock_run, lock_new_run (a failed command's run folder undone), stale temp files,
                             check_output_folder
    reslm.run.checkpoint     save_checkpoint, load_checkpoint, run_identity
    reslm.run.state_cache    StateCache: a character run's reservoir states kept on disk for --resume
    reslm.run.registry       published runs (results/NAME): manifest.json, weights.safetensors, checks
    reslm.run.source         record_source, read_source: the user's file a run's reservoir came from

Opening a run back as a model (its model with the checkpoint's weights) is reslm.models.load, and its
dataset reslm.data.datasets: they stand on the data and model layers, which this package stays below.

Files are written atomically and durably, so a kill or a power cut leaves the last complete
checkpoint, never a half-written one; a failed write (disk full) raises ReslmError "could not write
PATH: no space left on device" and keeps the previous file. JSON files are strict JSON.
"""
from reslm.run.checkpoint import CHECKSUM, RUN_KEY, load_checkpoint, run_identity, save_checkpoint
from reslm.run.folder import (CHECKPOINT, CONFIG, LOCK, METRICS, NAME_MAX, SUMMARY, MetricsLog,
                              create_run_dir, drop_stale_evals, is_finished, read_config, read_metrics,
                              schedule_key)
from reslm.run.lock import check_output_folder, check_runs_folder, clean_stale_temps, is_reslm_folder, lock_new_run, lock_run

__all__ = ["CHECKPOINT", "CHECKSUM", "CONFIG", "LOCK", "METRICS", "NAME_MAX", "RUN_KEY", "SUMMARY",
           "MetricsLog", "check_output_folder", "check_runs_folder", "drop_stale_evals", "clean_stale_temps", "create_run_dir",
           "is_finished", "schedule_key",
           "is_reslm_folder", "load_checkpoint", "lock_new_run", "lock_run", "read_config", "read_metrics",
           "run_identity", "save_checkpoint"]
