"""The foundation every stage stands on, importing nothing else of reslm's:

    errors.py       ReslmError (one line for the user), RunInUse, describe(): an exception as one line
    files.py        atomic writes, fsync, temp folders and the reasons a write failed
    progress.py     progress bars and lines (tqdm), switched off by --no-progress
    device.py       CPU/CUDA choice, precision (bf16 only where the CPU runs it natively), threads
    distributed.py  torch.distributed set-up for multi-process (DDP) training
    stop.py         a stop asked by SIGTERM, taken by a training at the end of its step
"""
