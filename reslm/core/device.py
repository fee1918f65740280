"""Support (every stage), device and numeric precision: one place decides, everything else asks.

precision "auto" = bf16 autocast on CUDA GPUs that support it, fp16 autocast with a GradScaler on
older GPUs, fp32 on CPU (deterministic; bf16 on CPU is available with precision="bf16").

bf16 is only worth it where the hardware computes it: on a CPU without bf16 instructions (e.g. an
AVX2-only x86) torch falls back to a scalar path that can be orders of magnitude slower than fp32.
`bf16_fast(device)` says whether bf16 pays here (CUDA: torch's answer; CPU: the instruction set,
confirmed once per process by a small bf16-vs-fp32 matmul), and `resolve_dtype` / `resolve_precision`
use it: a bf16 the user asked for on a slow CPU is refused with a one-line error, a bf16 that was
only a default falls back to fp32 with a one-line note on stderr. RESLM_BF16=1 (or 0) overrides the
check, for tests and for users who know better. `state_dtypes` picks the dtype reservoir states are
stored and computed in from the memory available (`available_memory`). `cpu_gemm` says which library
multiplies the reservoir recurrence's float32 matrices on this CPU (torch's BLAS or oneDNN).
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
import resource
import sys
import time

import torch

from reslm.core import claims
from reslm.core.errors import OutOfMemory, ReslmError
from reslm.core.progress import say

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
BF16_MIN_SPEED = 0.5           # bf16 must run a matmul at >= this fraction of the fp32 speed
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")   # x86 instructions that compute bf16 natively


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def idle_threads() -> int:
    """A thread count that does not oversubscribe a busy machine: the usable cores less the 1-minute
    load average (rounded), at least 1. On a quiet machine it is every core; beside two trainings on
    two cores it is 1 (torch's default there, 2 threads spinning against them, makes a dense LAPACK call
    such as an eigendecomposition tens of times slower)."""
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return max(1, min(cores, cores - int(load + 0.5)))


def use_threads(n: int | None = None) -> int:
    """Set torch's CPU threads and return the count: `n`, or idle_threads() when n is None or 0. More than
    the usable cores (a run's saved value from a bigger machine, or a hand edit) becomes the core count,
    with a one-line note on stderr: thousands of threads stall a machine, and torch crashes on more."""
    cores = usable_cores()
    want = n or idle_threads()
    if want > cores:
        print(f"reslm: note: {want} threads asked for, this machine runs {cores}: using {cores}", file=sys.stderr)
        want = cores
    if want != torch.get_num_threads():
        torch.set_num_threads(want)
    return want


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ReslmError(f"unknown device {name!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ReslmError("device cuda requested but CUDA is not available")
    return dev


# --- is bf16 fast here? ------------------------------------------------------------------------------
def cpu_bf16_flags() -> set[str] | None:
    """The bf16 instruction flags /proc/cpuinfo lists (a subset of BF16_CPU_FLAGS), or None where
    there is no /proc/cpuinfo to read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            words = set(f.read().split())
    except OSError:
        return None
    return words & set(BF16_CPU_FLAGS)


@functools.cache
def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it plus torch's kernel level, e.g. "AMD EPYC (AVX512)"; timings
    differ by CPU, so every report says which one made them."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name} ({torch.backends.cpu.get_cpu_capability()})"


def device_name(device: torch.device) -> str:
    """What computes on `device`, for the record: the GPU's name (e.g. "NVIDIA H200 (CUDA)") or the CPU's
    (cpu_name)."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA)"
    return cpu_name()


def bf16_matmul_speed(n: int = 256, reps: int = 5) -> float:
    """fp32 time / bf16 time of an (n, n) @ (n, n) matmul on the CPU, one thread, best of `reps`
    each (alternated, so that load from other processes hits both alike). > 1: bf16 is faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the instruction set is the question, not the scheduling of threads
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        pairs = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
        best = dict.fromkeys(pairs, float("inf"))
        for _ in range(reps + 1):          # the first round warms up
            for dtype, (x, y) in pairs.items():
                t0 = time.perf_counter()
                x @ y
                best[dtype] = min(best[dtype], time.perf_counter() - t0)
        return best[torch.float32] / best[torch.bfloat16]
    finally:
        torch.set_num_threads(threads)


@functools.cache
def cpu_bf16() -> tuple[bool, str]:
    """(fast, why not) for bf16 on this CPU, decided once per process.

    An x86 CPU below AVX-512 that lacks the bf16 instructions is slow without asking (and without
    spending the time of a slow bf16 matmul); every other CPU is asked by `bf16_matmul_speed`."""
    cap = torch.backends.cpu.get_cpu_capability()          # "AVX512", "AVX2", "DEFAULT", ...
    flags = cpu_bf16_flags()
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    if x86 and not flags and not cap.startswith("AVX512"):
        return False, f"{cap} without bf16 instructions"
    speed = bf16_matmul_speed()
    if speed < BF16_MIN_SPEED:
        return False, f"a bf16 matmul ran at {speed:.2g}x the fp32 speed"
    return True, ""


def bf16_status(device: torch.device | str) -> tuple[bool, str]:
    """(fast, why not): whether bf16 computes at least about as fast as fp32 on `device`.

    RESLM_BF16=1 / 0 decides without looking; otherwise CUDA asks torch and the CPU `cpu_bf16`.
    Other devices are not checked and count as slow (fp32 is always safe)."""
    device = torch.device(device)
    forced = os.environ.get("RESLM_BF16", "")
    if forced:
        if forced not in ("0", "1"):
            raise ReslmError(f"RESLM_BF16 must be 0 or 1, got {forced!r}")
        return forced == "1", "RESLM_BF16=0"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(), "this GPU has no bf16 support"
    if device.type == "cpu":
        return cpu_bf16()
    return False, f"bf16 speed is not checked on {device.type}"


def bf16_fast(device: torch.device | str) -> bool:
    """True when bf16 pays on `device` (see `bf16_status`)."""
    return bf16_status(device)[0]


def _use_bf16(device: torch.device, *, explicit: bool, what: str, instead: str) -> bool:
    """True when bf16 is fast; otherwise a ReslmError when the user asked for bf16 (`explicit`),
    or a note on stderr and False (the caller uses `instead`)."""
    fast, why = bf16_status(device)
    if fast:
        return True
    where = "GPU" if device.type == "cuda" else device.type.upper()
    if explicit:
        raise ReslmError(f"bf16 is slow on this {where} ({why}); use {instead} for {what} "
                         "(RESLM_BF16=1 forces bf16)")
    print(f"reslm: bf16 is slow on this {where} ({why}); using {instead} for {what}", file=sys.stderr)
    return False


# --- which library multiplies the reservoir's float32 matrices on a CPU --------------------------------
GEMMS = ("torch", "onednn")


def cpu_vendor() -> str | None:
    """The CPU's vendor_id in /proc/cpuinfo ("GenuineIntel", "AuthenticAMD", ...), None where absent."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), None)
    except OSError:
        return None


@functools.cache
def cpu_gemm() -> tuple[str, str]:
    """(library, why) for the reservoir recurrence's float32 GEMM on this CPU, decided once per process
    and the same on every run on one machine (no timing decides it, so a seed's states do not depend
    on the load): "onednn" (torch's oneDNN inner product, which chooses its kernels by the instruction
    set) where torch's BLAS is MKL and the CPU is not Intel's (MKL chooses its code path by the CPU's
    vendor and runs a generic one elsewhere), else "torch" (torch.addmm). RESLM_GEMM=torch or onednn
    decides without looking. Both compute the same products; their float32 sums may differ in the
    last bits."""
    forced = os.environ.get("RESLM_GEMM", "")
    if forced:
        if forced not in GEMMS:
            raise ReslmError(f"RESLM_GEMM must be one of {', '.join(GEMMS)}, got {forced!r}")
        if forced == "onednn" and not onednn_available():
            raise ReslmError("RESLM_GEMM=onednn: this torch has no oneDNN inner product")
        return forced, f"RESLM_GEMM={forced}"
    if not torch.backends.mkl.is_available():
        return "torch", "torch's BLAS is not MKL"
    vendor = cpu_vendor()
    if vendor in (None, "GenuineIntel"):
        return "torch", f"MKL on {vendor or 'an unknown vendor'}'s CPU"
    if not onednn_available():
        return "torch", "this torch has no oneDNN inner product"
    return "onednn", f"MKL runs its generic code path on {vendor} CPUs"


def onednn_available() -> bool:
    """Whether this torch has oneDNN's inner product (torch.ops.mkldnn._linear_pointwise) on the CPU."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


# --- dtypes and precisions ---------------------------------------------------------------------------
def state_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ReslmError(f"unknown dtype {name!r} (use float32 or bfloat16)")
    return DTYPES[name]


def available_memory(device: torch.device) -> int | None:
    """Bytes free on a GPU, or the machine's available memory (None where it cannot be read)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_limit() -> int | None:
    """The most memory this process can ever hold, in bytes: the machine's physical memory, lowered by a
    cgroup limit (a container's memory.max) and by the process's address-space limit (`ulimit -v`); None
    where none can be read."""
    limits = []
    with contextlib.suppress(OSError, ValueError):
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    with contextlib.suppress(OSError, ValueError), open("/sys/fs/cgroup/memory.max") as f:
        text = f.read().strip()
        if text.isdigit():
            limits.append(int(text))
    with contextlib.suppress(OSError, ValueError):
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    return min(limits) if limits else None


def device_limit(device: torch.device) -> int | None:
    """The most memory `device` can ever give this process, in bytes: a GPU's whole memory, or on the CPU
    memory_limit() (the machine, its cgroup, `ulimit -v`); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    return memory_limit()


def amount(n: float) -> str:
    """Bytes with one decimal: GiB from a tenth of one ("122.1 GiB"), MiB below ("12.3 MiB")."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"


def check_memory(need: int, what: str, fix: str, device: torch.device | str = "cpu") -> None:
    """The one rule of every memory check made before the work it counts (a model's weights, a run's
    states and its reservoir's passes, a memory profile's windows): ReslmError (exit 2: it can never fit,
    trying again will not help) when `need` bytes is more than this process can ever hold on `device`
    (device_limit), OutOfMemory (exit 75: try again when the machine is free) when it is more than the
    memory available now. One line of reslm's own: "`what` needs at least X GiB, more than the Y GiB this
    machine lets reslm hold: `fix`" (or "... but Y GiB is available now: free memory, or `fix`"; `amount`);
    `fix` names the flag that shrinks it.""" 
    device = torch.device(device)
    limit, avail = device_limit(device), available_memory(device)
    if limit is not None and need > limit:
        raise ReslmError(f"{what} needs at least {amount(need)}, more than the {amount(limit)} this machine lets "
                         f"reslm hold: {fix}")
    if avail is not None and need > avail:
        raise OutOfMemory(f"{what} needs at least {amount(need)} but {amount(avail)} is available now: free "
                          f"memory, or {fix}")


def reservoir_pass_bytes(mode: str, positions: int, size: int, embed_dim: int, context: int, streams: int,
                         warmup: int | None, readout_dim: int = 0, itemsize: int = 4,
                         chunk_elems: int = 2**22) -> int:
    """The working buffers, at least, that one pass of a reservoir over `positions` characters holds beside
    the states it stores (reslm.reservoir.states.shard_states, with its chunk_elems). Stream mode: B =
    min(streams, positions) streams side by side, each first reading min(warmup, its length) characters
    (the state and the warm-up's states and inputs), then chunks of k steps (the carried state and the
    chunk's states, inputs and readout: k = 1 once B N passes chunk_elems). Window mode: a batch of at least
    256 windows of `context` steps (their states, inputs and indices). `itemsize`: the compute dtype's
    bytes. The streams and the context are what it scales with: a stream per character holds two or more
    copies of a shard's states at once."""
    positions, N, d, D = max(1, positions), size, embed_dim, readout_dim
    if mode == "window":
        batch = min(positions, max(256, chunk_elems // max(1, context * N)))
        return batch * (itemsize * ((context + 1) * N + context * d) + 8 * context)
    B = max(1, min(streams, positions))
    L = -(-positions // B)                       # positions per stream
    w = min(context if warmup is None else warmup, L)
    k = max(1, min(L, chunk_elems // (B * N)))   # steps per chunk
    warm = (1 + w) * N + w * d                   # the state; the warm-up's states and inputs
    chunk = (1 + k) * N + k * (d + D)            # the carried state; the chunk's states, inputs and readout
    return itemsize * B * max(warm, chunk) + 8 * B * max(w, k)


# a margin for what a training process holds besides its states (torch, the text, the head's batches, the
# reservoir's working buffers while it computes a shard), counted in every state check
WORKING_BYTES = 2**30


def state_dtypes(name: str, device: torch.device, width: int, train_rows: int, test_rows: int,
                 heldout_rows: int = 0, extra_bytes: int = 0) -> tuple[torch.dtype, torch.dtype]:
    """(storage, compute) dtypes of reservoir states held in memory at once: `train_rows` states of one
    training shard, `test_rows` test states and `heldout_rows` held-out (validation) states, `width`
    values each, beside WORKING_BYTES of the process's own and `extra_bytes` (the reservoir's working
    buffers while it computes a shard, beyond that margin: reservoir_pass_bytes, which the streams scale).
    name "auto" stores them in float32 when that fits in memory and in bfloat16 (half the memory, on any
    machine) otherwise. bfloat16 is computed in only where it is fast (bf16_status); elsewhere the reservoir
    computes in float32. OutOfMemory (exit status 75: other processes may hold the memory) when the chosen
    storage does not fit in 90% of the memory available now, with the flag that would help; ReslmError
    (exit 2, the rule of check_memory) when it is more than this process can ever hold (device_limit),
    which no wait mends. On a CPU the memory available is the machine's less what other reslm trainings
    have claimed and not yet allocated, and the states chosen are claimed in turn (reslm.core.claims): two
    trainings started together do not both count the same memory."""
    rows = train_rows + test_rows + heldout_rows
    need = lambda dtype: rows * width * dtype.itemsize + WORKING_BYTES + extra_bytes  # noqa: E731
    shared = device.type != "cuda"   # the machine's memory, which other processes share
    with claims.claiming() if shared else contextlib.nullcontext():
        avail = available_memory(device)
        if avail is not None and shared:
            avail = max(0, avail - claims.unclaimed())
        storage = _state_storage(name, avail, need, width, train_rows + heldout_rows, device_limit(device),
                                 extra_bytes)
        if shared:
            claims.claim(need(storage))
    compute = storage
    if storage == torch.bfloat16:
        fast, why = bf16_status(device)
        if not fast:
            compute = torch.float32
            say(f"reslm: reservoir states computed in float32, not bfloat16 ({why})")
    return storage, compute


def _state_storage(name: str, avail: int | None, need, width: int, other_rows: int,
                   limit: int | None = None, extra: int = 0) -> torch.dtype:
    """The storage dtype of `state_dtypes`, or ReslmError beyond `limit` (what the process can ever hold),
    OutOfMemory beyond 90% of `avail`; `need(dtype)`: the bytes it takes, `other_rows` the states held besides
    the test states."""
    if name == "auto":
        fp32_fits = (avail is None or need(torch.float32) <= 0.9 * avail) and \
            (limit is None or need(torch.float32) <= limit)
        storage = torch.float32 if fp32_fits else torch.bfloat16
        if not fp32_fits:
            room = avail if avail is not None and need(torch.float32) > 0.9 * avail else limit
            say(f"reslm: reservoir states stored in bfloat16: float32 would need {need(torch.float32) / 2**30:.1f} "
                f"GiB of the {room / 2**30:.1f} GiB {'available' if room == avail else 'this machine lets reslm hold'}")
    else:
        storage = state_dtype(name)
    row = width * storage.itemsize

    def hint(room: float) -> str:
        fits = int((room - WORKING_BYTES - extra) / row) - other_rows   # test samples that would fit
        said = f"--eval-samples {fits // 1000 * 1000}" if fits >= 1000 else "a smaller reservoir"
        return f"--state-dtype bfloat16 or {said}" if storage != torch.bfloat16 else said
    if limit is not None and need(storage) > limit:   # never fits here: exit 2, not "try again later"
        raise ReslmError(f"reservoir states need {need(storage) / 2**30:.1f} GiB (train shard, test and held-out "
                         f"states, the process's own), more than the {limit / 2**30:.1f} GiB this machine lets "
                         f"reslm hold: use {hint(limit)}")
    if avail is not None and need(storage) > 0.9 * avail:
        raise OutOfMemory(f"reservoir states need {need(storage) / 2**30:.1f} GiB (train shard, test and held-out "
                          f"states, the process's own) but {avail / 2**30:.1f} GiB is available: use "
                          f"{hint(0.9 * avail)}, or free memory")
    return storage


def resolve_dtype(name: str, device: torch.device | str, *, explicit: bool, what: str) -> torch.dtype:
    """The dtype `name` stands for, except that bfloat16 where it is slow becomes float32 (with a
    note on stderr), or an error when the user asked for bf16 explicitly. `what` names the tensors
    in the messages ("reservoir states")."""
    dtype = state_dtype(name)
    if dtype == torch.bfloat16 and not _use_bf16(torch.device(device), explicit=explicit, what=what,
                                                 instead="float32"):
        return torch.float32
    return dtype


def resolve_precision(precision: str, device: torch.device, *, explicit: bool = True) -> str:
    """"auto" -> what suits the device; "bf16" is checked with `bf16_fast` (refused when slow and
    explicit, else replaced by fp32 on CPU / fp16 on CUDA); "fp16" needs CUDA."""
    if precision not in PRECISIONS:
        raise ReslmError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if bf16_fast(device) else "fp16"
    if precision == "fp16" and device.type != "cuda":
        raise ReslmError("fp16 training needs a CUDA device (use bf16 or fp32 on CPU)")
    if precision == "bf16":
        instead = "fp16" if device.type == "cuda" else "fp32"
        if not _use_bf16(device, explicit=explicit, what="training", instead=f"precision {instead}"):
            return instead
    return precision


def autocast(precision: str, device: torch.device):
    """Context manager for the forward pass under the resolved precision."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device):
    """A GradScaler for fp16 (dynamic loss scaling); a disabled one otherwise."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def synchronize(device: torch.device):
    """Wait for queued GPU work before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def setup_cuda():
    """TF32 matmuls and cuDNN autotuning on GPUs (no effect on CPU)."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
