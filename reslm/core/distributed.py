"""Multi-process (DistributedDataParallel) helpers for `torchrun --nproc_per_node=K`.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them everything here is a no-op for a single
process: `init()` returns (0, 1, 0) and starts no process group. The backend is gloo on CPU and nccl on
CUDA (each rank on cuda:LOCAL_RANK).
"""
from __future__ import annotations

import atexit
import os

import torch
import torch.distributed as dist


def env_world() -> tuple[int, int, int]:
    """(rank, world, local_rank) as torchrun gives them in the environment; (0, 1, 0) without it."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, 0
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def launched_main() -> bool:
    """Whether this process owns a run folder: rank 0 of a torchrun launch, or a process torchrun did not
    launch (RANK unset). Read from the environment, so it holds before any process group exists."""
    return os.environ.get("RANK", "0") == "0"


def init(device: str = "auto") -> tuple[int, int, int]:
    """Join the process group (once) when launched by torchrun; returns (rank, world, local_rank).

    `device` is the training device setting (auto | cpu | cuda[:N]): gloo unless it may use CUDA and
    CUDA is there, then nccl with cuda:local_rank as this process's device."""
    rank, world, local_rank = env_world()
    if world <= 1 or not dist.is_available():
        return 0, 1, 0
    if not dist.is_initialized():
        use_cuda = torch.cuda.is_available() and not str(device).startswith("cpu")
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", rank=rank, world_size=world)
        atexit.register(cleanup)
    return dist.get_rank(), dist.get_world_size(), local_rank


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if active():
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Mean of `tensor` over the ranks (in place, also returned); the tensor itself for one process."""
    if active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= dist.get_world_size()
    return tensor


def all_ok(ok: bool) -> bool:
    """True when `ok` holds on every rank (lets rank 0 report a failure instead of leaving the others
    waiting at a barrier)."""
    if not active():
        return ok
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([0 if ok else 1], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return int(t.item()) == 0


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
