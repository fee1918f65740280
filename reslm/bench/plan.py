"""Benchmarks: what `reslm bench` measures (BenchPlan), the targets and the quoted figures it compares with."""
from __future__ import annotations

from dataclasses import dataclass, replace

from reslm.core.errors import ReslmError
from reslm.models import PRESETS

# Figures the issue quotes for the authors' code (2 threads, batch 1024, fp32), samples/s.
AUTHORS_QUOTED = {"rc-750": 4100.0, "rc-2600": 410.0, "aerc-100-20": 52000.0, "aerc-160-30": 24700.0,
                  "tf-128-8-8": 737.0}
AUTHORS_QUOTED_CONDITIONS = ("the authors' code as quoted in the issue: 2 CPU threads, batch 1024, fp32; "
                             "RC/AERC: windowed recompute of the reservoir per batch")
# Targets of the issue: reservoir recurrence >= 80% of GEMM; training speed-up over the authors.
TARGETS = {"reservoir_vs_gemm": 0.8, "speedup_vs_authors": {"rc": 20.0, "aerc": 2.5, "tf": 3.0}}
SUFFIX = {"float32": "", "bfloat16": "_bf16"}   # dtype -> suffix of its headline keys
MODES = ("window", "stream")


# --- plan ------------------------------------------------------------------------------------------
SECTIONS = ("recurrence", "states", "training", "window", "tokens", "substrates")   # what `--only` can pick


def parse_sections(sections) -> tuple[str, ...]:
    """"a,b" or a list -> a tuple of SECTIONS, in their order; one-line error on anything else
    (an empty choice included: it is not the whole bench)."""
    items = [v.strip() for v in sections.split(",") if v.strip()] if isinstance(sections, str) else list(sections)
    bad = [v for v in items if v not in SECTIONS]
    if bad or not items:
        raise ReslmError(f"unknown bench section {', '.join(bad) or '(none)'}: use a comma-separated subset of "
                         f"{','.join(SECTIONS)}")
    return tuple(v for v in SECTIONS if v in items)


@dataclass
class BenchPlan:
    """What to measure and how long to spend on it. Work sizes are in flops of the recurrent
    products; counts are derived from them per N and clamped, so big reservoirs get fewer steps."""

    batch: int = 1024                      # samples per training step, streams per recurrence
    context: int = 32                      # chars per window
    epochs_per_shard: int = 5              # the paper's schedule (states reused this many times)
    lr: float = 1e-4
    vocab: int = 59
    embed_dim: int = 16
    # 1. recurrence vs GEMM
    recurrence_sizes: tuple = (750, 2600)
    recurrence_dtypes: tuple = ("float32", "bfloat16")
    recurrence_work: float = 40e9          # flops per timed run -> T = work / (2 B N^2), clamped
    recurrence_steps: tuple = (3, 32)      # (min, max) T
    # 2. reservoir states (chars/s) in fp32 for these sizes and those of the reservoir models
    states_sizes: tuple = (750, 2600)
    states_bf16: bool = True               # also states_sizes with bfloat16 states (not used for training)
    stream_work: float = 1.0e12            # flops per timed shard_states run in stream mode
    stream_steps: tuple = (32, 128)        # (min, max) steps per stream after the warm-up
    stream_warmup: int = 32                # tokens each stream reads first (the model default)
    window_work: float = 0.4e12            # flops per timed shard_states run in window mode
    window_samples: tuple = (64, None)     # (min, max); max None = one shard_states chunk
    # 3./4. training
    models: tuple = ("rc-750", "rc-2600", "aerc-100-20", "aerc-160-30", "tf-128-8-8", "tf-256-16-16",
                     "rnn-gru-32-200")
    head_steps: int = 5                    # training steps per timed repetition (head only)
    authors_steps: int = 1                 # steps per repetition of the windowed recompute
    tf_steps: int = 2                      # transformer training steps per repetition
    tf_warmup: int = 2                     # untimed transformer steps first
    tf_gemm: tuple = (1024, 768, 4)        # (rows, N, count): the GEMM timed beside the transformer, fp32
    # the transformer's window step: fused kernel and plain path, fp32 and bf16, beside fp32 and bf16 GEMMs
    window_models: tuple = ("tf-128-8-8", "tf-256-16-16")
    # repetitions (see reslm.bench.timing.repeat)
    reps: int = 3                          # at least this many timed repetitions ...
    max_reps: int = 20                     # ... and up to this many while under min_time_s
    min_time_s: float = 3.0
    budget_s: float = 20.0                 # no new repetition after this many seconds
    seed: int = 0
    token_level: bool = True               # 5. LAERC vs GPT (reslm.bench.tokens)
    substrate_chars: int = 2**16           # 6. characters per timed stream of each substrate (0: skip)

    @classmethod
    def full(cls) -> "BenchPlan":
        return cls()

    @classmethod
    def quick(cls) -> "BenchPlan":
        return cls(recurrence_work=12e9, recurrence_steps=(2, 16), stream_work=0.3e12, stream_steps=(16, 64),
                   window_work=0.05e12, states_bf16=False, models=("rc-750", "aerc-100-20", "tf-128-8-8", "rnn-gru-32-200"), head_steps=4,
                   window_models=("tf-128-8-8",), tf_steps=1, tf_warmup=1, reps=1, max_reps=10, min_time_s=1.0, budget_s=3.0,
                   substrate_chars=2**13)

    def only(self, sections) -> "BenchPlan":
        """This plan measuring only some of SECTIONS ("training" also times its models' states)."""
        keep = set(parse_sections(sections))
        return replace(self, recurrence_dtypes=self.recurrence_dtypes if "recurrence" in keep else (),
                       states_sizes=self.states_sizes if "states" in keep else (),
                       states_bf16=self.states_bf16 and "states" in keep,
                       models=self.models if "training" in keep else (),
                       window_models=self.window_models if "window" in keep else (),
                       token_level=self.token_level and "tokens" in keep,
                       substrate_chars=self.substrate_chars if "substrates" in keep else 0)

    def timing(self) -> dict:
        """The keyword arguments of reslm.bench.timing.repeat."""
        return dict(reps=self.reps, budget_s=self.budget_s, min_time_s=self.min_time_s, max_reps=self.max_reps)


def _spec(model) -> tuple[str, str, dict]:
    """(label, family, config overrides) from a preset name or a (label, family, overrides) triple."""
    if isinstance(model, str):
        family, overrides, _ = PRESETS[model]
        return model, family, dict(overrides)
    label, family, overrides = model
    return label, family, dict(overrides)


def _clamp(x: float, lo: int, hi: int | None) -> int:
    x = max(lo, int(round(x)))
    return x if hi is None else min(hi, x)
