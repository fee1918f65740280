"""The experiments as data: each command's budgets, sizes and settings, and the functions that turn
them into plans (lists of `Run`) for `run_plan`.

    BUDGETS    `reslm reproduce` (and `reslm lab`): smoke / quick / paper training budgets
    SWEEPS     the LAERC vs. GPT size families of the scaling sweep and their shared training budget
    SUBSTRATES `reslm lab`: model overrides of each substrate at the paper's largest reservoir budgets
    DEMO_*     `reslm demo`: three presets at the paper's matched ~45k trainable parameters

Budgets: `smoke` draws every figure from tiny training (minutes; a test runs it), `quick` gives
meaningful numbers in well under an hour on 2 CPU cores, `paper` is the paper's protocol (hours on a
CPU; meant for a GPU). `left_out` says what each drops from the paper's protocol.

Sweeps: "cpu" is sized for `bpe:4096` on Shakespeare on 2 CPU cores (context 128, micro-batch 16, 300
steps); GPT has the same number of layers as its LAERC partner and the width (multiple of 8) whose
trainable-parameter count is closest to LAERC's (`param_table`: within 5%). At V = 4096 the tied
embedding is a large share of every count, so N spans less than a decade and the fitted slopes are
noisy. "cpu-scaling" (the published sweep, docs/laerc.md) has five sizes per family over 1.6 decades at
1,500 steps each (about one epoch of that corpus), ordered size by size, then its `extras`: the
--no-reservoir ablation at two sizes and the authors' variant at one. "cpu-scaling-4ep" is the same
over 6,000 steps (about four epochs), its runs named with the suffix -4ep. "paper" has larger models for a
GPT-2 vocabulary at context 512, micro-batch 32, grad accumulation 4 (Appendix A.3), 5000 steps: it
needs a GPU. The paper does not list its sizes; these
only span the same kind of range. "smoke": two tiny sizes per family (numbers meaningless).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from reslm.core.errors import ReslmError
from reslm.core.metrics import MIN_TRAIN_LOSS, VAL_LOSS, best_of, final_of
from reslm.models import PRESETS, families, preset
from reslm.models.gpt import GPTConfig, gpt_param_count
from reslm.models.laerc import AUTHORS_VARIANT, LAERCConfig, laerc_param_count
from reslm.models.substrates import BUDGET_PRESET, SUBSTRATES, model_overrides  # noqa: F401 (the lab plan's table)
from reslm.settings import authors_train


# --- plans ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One row of a plan: the run's folder name, its family, model and training overrides, the Table-1
    preset it is (if any) and whether its reservoir states are kept on disk across interruptions."""
    name: str
    family: str
    model: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    preset: str | None = None
    cache_states: bool = False


def parse_names(value, known, what: str, plural: str | None = None) -> tuple[str, ...]:
    """A comma-separated string (or a list) of names checked against `known`, returned in `known`'s
    order; an unknown or empty selection is one ReslmError naming the choices ("unknown WHAT x" or,
    for several, "unknown PLURAL x, y")."""
    items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else list(value)
    bad = [v for v in items if v not in known]
    if bad or not items:
        what = (plural or f"{what}s") if len(bad) > 1 else what
        raise ReslmError(f"unknown {what} {', '.join(bad) or '(none)'}: use a comma-separated subset of "
                         f"{','.join(known)}")
    return tuple(v for v in known if v in items)


# --- reproduce ---------------------------------------------------------------------------------------
CHAR_FAMILIES = ("tf", "rc", "aerc")          # the paper's order (MODELS holds the same names)
TOKEN_FAMILIES = families("tokens")
ALL_FAMILIES = CHAR_FAMILIES + TOKEN_FAMILIES
assert set(CHAR_FAMILIES) <= set(families("chars"))   # rnn: the frontier's ceiling, not in the paper
RESERVOIR_FAMILIES = ("rc", "aerc")
STATE_DTYPES = ("auto", "float32", "bfloat16")   # --state-dtype of the rc / aerc presets


@dataclass
class Budget:
    """Everything a budget fixes; `left_out` says what it drops from the paper's protocol."""
    name: str
    char_train: dict                       # TrainConfig overrides shared by the 15 presets
    token_sweep: str                       # a SWEEPS name
    reservoir_model: dict = field(default_factory=dict)  # model overrides of the rc / aerc presets
    reservoir_train: dict = field(default_factory=dict)  # training overrides of the rc / aerc presets
    token_train: dict = field(default_factory=dict)  # overrides of that sweep's training budget
    token_data: str = "shakespeare-bpe4096"
    gen_length: int = 2000                 # generated characters per char run (tokens: gen_length // 4)
    score: int = 65536                     # test positions scored per run (0: all)
    kn_orders: tuple = tuple(range(1, 11))
    cache_states: bool = False             # keep reservoir states on disk across interruptions (train())
    left_out: str = ""


BUDGETS = {
    "smoke": Budget(
        name="smoke",
        char_train=dict(epochs_per_shard=1, cycles=1, shard_chars=4096, epoch_samples=256, eval_samples=1024,
                        batch_size=128, lr=3e-3, log_every=1),
        token_sweep="smoke", token_train=dict(max_steps=12, context=64, batch_size=8, warmup_steps=2,
                                            eval_every=6, eval_batches=2, log_every=1),
        gen_length=300, score=2048, kn_orders=(1, 2, 3, 4, 5, 6),
        left_out="nearly all training: 256 samples per shard-epoch from the first 4,096 characters of each "
                 "shard, 1 epoch per shard (the paper: 5 epochs on each full shard); 12 LAERC/GPT steps at two "
                 "tiny sizes per family. "
                 "It checks that every stage runs and every figure is drawn; its numbers mean nothing."),
    "quick": Budget(
        name="quick",
        char_train=dict(epochs_per_shard=1, cycles=1, shard_chars=131072, epoch_samples=32768,
                        eval_samples=16384, batch_size=256, lr=1e-3, log_every=16),
        token_sweep="cpu",
        left_out="the first 131,072 characters of each training shard, 32,768 samples per shard-epoch, one "
                 "epoch per shard, batch 256 and lr 1e-3 (the paper: 5 epochs over each full shard, batch 1024, "
                 "lr 1e-4, i.e. ~40 M samples per model, ~250x more); test CE on 16,384 samples spread over the "
                 "test shard (the paper: all of it). LAERC/GPT: the `cpu` sweep (bpe:4096 Shakespeare, 300 "
                 "steps of 16x128 tokens) instead of GPT-2 tokens of OpenWebText."),
    "paper": Budget(
        name="paper",
        # the family defaults are the paper's protocol (5 epochs per full shard, batch 1024, Adam 1e-4,
        # the whole test shard); states stored in bfloat16 where float32 would not fit in memory
        char_train=dict(state_dtype="auto"),
        reservoir_model=dict(context_mode="window"),   # every sample's state from its own 32-char window
        token_sweep="paper", token_data="shakespeare-gpt2", gen_length=10000, score=0,
        cache_states=True,   # a shard's window states take hours at rc-1750/2600: never compute them twice
        left_out="the number of cycles over the five training shards, which the paper does not give (1 "
                 "here unless --cycles K). Otherwise the character protocol is the paper's: window "
                 "context (each sample's reservoir state from a zero state over its own 32 characters), "
                 "5 epochs per full shard, batch 1024, Adam 1e-4, the whole test shard; reservoir states "
                 "are stored in bfloat16 where float32 does not fit in memory (rc-2600 on 24 GiB). The "
                 "token-level sweep uses the paper's batch and context on GPT-2 tokens of Shakespeare unless "
                 "--token-data names an OpenWebText dataset (`reslm data bpe --corpus openwebtext --max-docs N`)."),
}


def parse_presets(presets, fams) -> tuple[str, ...] | None:
    """None (every Table-1 preset of the chosen families) or the named ones, checked."""
    if presets is None:
        return None
    if isinstance(presets, str):
        presets = [p.strip() for p in presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown or not presets:
        raise ReslmError(f"unknown preset {', '.join(unknown) or '(none)'}: see `reslm presets`")
    excluded = [p for p in presets if PRESETS[p][0] not in fams]
    if excluded:
        raise ReslmError(f"preset {', '.join(excluded)} is not in --families {','.join(fams)}")
    return tuple(presets)


def char_plan(budget: Budget, fams, presets, device: str) -> list[Run]:
    """The Table-1 presets of `fams` (or the named `presets`), with the budget's overrides; the frontier's
    ceilings (presets without a paper count) only when named."""
    res = RESERVOIR_FAMILIES
    return [Run(name, fam, {**model, **(budget.reservoir_model if fam in res else {})},
                {**budget.char_train, "device": device, **(budget.reservoir_train if fam in res else {})},
                preset=name, cache_states=budget.cache_states and fam in res)
            for name, (fam, model, paper) in PRESETS.items()
            if fam in fams and (name in presets if presets is not None else paper is not None)]


# --- the scaling sweep ----------------------------------------------------------------------------------
@dataclass
class Sweep:
    """Model sizes per family (LAERCConfig / GPTConfig overrides; vocab_size comes from the dataset)
    and the training budget (TrainConfig overrides) that every run shares."""
    name: str
    sizes: dict[str, list[dict]]
    train: dict
    note: str = ""
    order: str = "family"          # "family": every LAERC size, then every GPT size; "size": LAERC and GPT
                                   # of one size, then the next size up (a partial sweep holds both families)
    extras: list = field(default_factory=list)   # (name, family, model overrides, train overrides): trained
                                   # after the sizes with the sweep's budget under their own overrides (ablations)
    suffix: str = ""               # appended to every run name, so that two budgets publish side by side


def _sizes(shapes, context: int, **common) -> list[dict]:
    return [dict(dim=d, n_layers=n, context=context, **common) for d, n in shapes]


_CPU_TRAIN = dict(batch_size=16, grad_accum=1, max_steps=300, warmup_steps=30,
                  eval_every=100, eval_batches=10, log_every=10, lr=1e-3)
# "cpu-scaling": 1,500 steps of 16 x 128 tokens (3.07 M tokens, about one epoch over the 3.02 M-token train
# split of shakespeare-bpe4096) at every size; warm-up 5% of the steps, cosine to 10% of the peak.
_SCALING_TRAIN = dict(batch_size=16, grad_accum=1, max_steps=1500, warmup_steps=75,
                      eval_every=150, eval_batches=20, log_every=10, lr=1e-3, threads=1)
# "cpu-scaling-4ep": the same sizes and schedule shape over 6,000 steps (12.3 M tokens, about 4 epochs), where
# the larger models of this 3 M-token corpus are expected to stop improving on validation.
_LONG_TRAIN = dict(_SCALING_TRAIN, max_steps=6000, warmup_steps=300, eval_every=300)
_PAPER_TRAIN = dict(batch_size=32, grad_accum=4, max_steps=5000, warmup_steps=100,
                    eval_every=250, eval_batches=20, log_every=10, lr=6e-4)

_SCALING_SIZES = {"laerc": _sizes([(8, 1), (16, 1), (32, 2), (48, 3), (96, 4)], 128, r_mult=4),
                  "gpt": [dict(dim=d, n_layers=n, context=128, n_heads=h)
                          for d, n, h in [(8, 1, 1), (17, 1, 1), (38, 2, 2), (64, 3, 4), (140, 4, 7)]]}


def _scaling_extras(steps: int, suffix: str = "") -> list:
    """The --no-reservoir ablation at (32, 2) and (96, 4), and the authors' variant at (32, 2), with its
    own schedule over `steps`."""
    return [(f"laerc-d32-l2-noreservoir{suffix}", "laerc", dict(dim=32, n_layers=2, context=128, r_mult=4,
                                                                no_reservoir=True), {}),
            (f"laerc-d96-l4-noreservoir{suffix}", "laerc", dict(dim=96, n_layers=4, context=128, r_mult=4,
                                                                no_reservoir=True), {}),
            (f"laerc-d32-l2-authors{suffix}", "laerc", dict(dim=32, n_layers=2, context=128, **AUTHORS_VARIANT),
             authors_train(steps))]


SWEEPS: dict[str, Sweep] = {
    "cpu": Sweep(
        name="cpu",
        sizes={"laerc": _sizes([(32, 2), (48, 3), (64, 4), (96, 4)], 128, r_mult=4),
               "gpt": _sizes([(40, 2), (64, 3), (88, 4), (136, 4)], 128, n_heads=4)},
        train=_CPU_TRAIN,
        note="bpe:4096 Shakespeare, sized for 2 CPU cores"),
    "cpu-scaling": Sweep(
        name="cpu-scaling",
        # LAERC 35,946 .. 1,521,992 trainable parameters (1.63 decades); each GPT the width (heads of width
        # 16-20) whose count is closest to its partner's: within 3.6%
        sizes=_SCALING_SIZES, train=_SCALING_TRAIN, order="size", extras=_scaling_extras(1500),
        note="bpe:4096 Shakespeare, 5 sizes per family over 1.6 decades, ~1 epoch per run, one CPU thread; "
             "then the --no-reservoir ablation at two sizes and the authors' variant at one"),
    "cpu-scaling-4ep": Sweep(
        name="cpu-scaling-4ep",
        sizes=_SCALING_SIZES, train=_LONG_TRAIN, order="size", extras=_scaling_extras(6000, "-4ep"), suffix="-4ep",
        note="cpu-scaling's sizes and ablations over ~4 epochs (6,000 steps) per run, runs named *-4ep"),
    "smoke": Sweep(
        name="smoke",
        sizes={"laerc": _sizes([(16, 1), (24, 2)], 128, r_mult=4),
               "gpt": _sizes([(16, 1), (24, 2)], 128, n_heads=4)},
        train=_CPU_TRAIN,
        note="two tiny sizes per family: checks that the sweep, the scaling fit and its figure run"),
    "paper": Sweep(
        name="paper",
        sizes={"laerc": _sizes([(128, 4), (192, 4), (256, 6), (384, 6)], 512, r_mult=4),
               "gpt": _sizes([(144, 4), (224, 4), (320, 6), (512, 6)], 512, n_heads=8)},
        train=_PAPER_TRAIN,
        note="GPT-2 vocabulary, Appendix A.3 batch (512 x 32 x 4); needs a GPU"),
}


def get_sweep(sweep: str | Sweep) -> Sweep:
    if isinstance(sweep, Sweep):
        return sweep
    if sweep not in SWEEPS:
        raise ReslmError(f"unknown sweep {sweep!r} (use {', '.join(SWEEPS)})")
    return SWEEPS[sweep]


def sweep_run_name(family: str, model: dict, suffix: str = "") -> str:
    return f"{family}-d{model['dim']}-l{model['n_layers']}{suffix}"


def sweep_plan(sweep: str | Sweep, fams, train_overrides: dict | None = None) -> list[Run]:
    """Every (family, size) of the sweep, named <family>-d<D>-l<L>; a `context` training override is a
    shorter window for every size (a model field)."""
    sw = get_sweep(sweep)
    for fam in fams:
        if fam not in families("tokens"):
            raise ReslmError(f"unknown family {fam!r} (use {' or '.join(families('tokens'))})")
        if fam not in sw.sizes:
            raise ReslmError(f"sweep {sw.name!r} has no sizes for family {fam!r}")
    train_over = {**sw.train, **(train_overrides or {})}
    context = train_over.pop("context", None)
    ctx = {"context": context} if context else {}
    if sw.order == "size":
        n = max(len(sw.sizes[fam]) for fam in fams)
        models = [(fam, dict(sw.sizes[fam][i], **ctx)) for i in range(n) for fam in fams if i < len(sw.sizes[fam])]
    else:
        models = [(fam, dict(m, **ctx)) for fam in fams for m in sw.sizes[fam]]
    return [Run(sweep_run_name(fam, m, sw.suffix), fam, m, train_over) for fam, m in models]


def extras_plan(sweep: str | Sweep, fams, train_overrides: dict | None = None) -> list[Run]:
    """The sweep's extra runs (ablations) of the families in `fams`: the sweep's budget under each run's
    own training overrides, then `train_overrides`; not part of the scaling fit."""
    runs = []
    for name, fam, model, train in get_sweep(sweep).extras:
        if fam not in fams:
            continue
        over = {**get_sweep(sweep).train, **train, **(train_overrides or {})}
        context = over.pop("context", None)
        runs.append(Run(name, fam, dict(model, **({"context": context} if context else {})), over))
    return runs


def sweep_rows(plan: list[Run], summaries: list[dict]) -> list[dict]:
    """One row per sweep run (reslm.report.scaling.CSV_FIELDS) from its summary."""
    return [dict(family=r.family, name=r.name, dim=r.model["dim"], n_layers=r.model["n_layers"],
                 trainable_params=s["trainable_params"], fixed_params=s.get("fixed_params", 0),
                 **{MIN_TRAIN_LOSS: s.get(MIN_TRAIN_LOSS), best_of(VAL_LOSS): s.get(best_of(VAL_LOSS))},
                 **{final_of(VAL_LOSS): s.get(final_of(VAL_LOSS))},
                 steps=s.get("steps"), train_seconds=s.get("train_seconds")) for r, s in zip(plan, summaries)]


def param_table(sweep: str | Sweep, vocab_size: int, fams=("laerc", "gpt")) -> list[dict]:
    """Trainable/fixed parameter counts of a sweep's models at a vocabulary size (closed forms)."""
    sw = get_sweep(sweep)
    table = []
    for fam in fams:
        for model in sw.sizes.get(fam, []):
            m = {**model, "vocab_size": vocab_size}
            if fam == "laerc":
                trainable, fixed = laerc_param_count(LAERCConfig(**m))
            else:
                trainable, fixed = gpt_param_count(GPTConfig(**m)), 0
            table.append(dict(family=fam, name=sweep_run_name(fam, model, sw.suffix), trainable_params=trainable,
                              fixed_params=fixed))
    return table


# --- the lab -------------------------------------------------------------------------------------------
# (the substrates and their settings at each family's budget: reslm.models.substrates)
LAB_FAMILIES = RESERVOIR_FAMILIES
LAB_BUDGETS = ("smoke", "quick", "paper")
NOISE_GRID = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0)
BITS_GRID = (0, 8, 6, 4, 3, 2, 1)   # 0: no ADC


def lab_plan(budget: Budget, substrates, fams, device: str) -> list[Run]:
    """Every (family, substrate) at its family's budget, named <family>-<substrate>, substrate-major."""
    return [Run(f"{fam}-{sub}", fam, model_overrides(sub, fam), dict(budget.char_train, device=device))
            for sub in substrates for fam in fams]


# --- the demo ------------------------------------------------------------------------------------------
DEMO_PRESETS = ["rc-750", "aerc-100-20", "tf-128-8-8"]
DEMO_TRAIN = dict(epochs_per_shard=1, cycles=1, shard_chars=131072, epoch_samples=32768, eval_samples=16384,
                  batch_size=256, lr=3e-3, log_every=16)
DEMO_PROMPT = "to be, or not to be, that is the question:"


def demo_plan(presets, train_overrides: dict | None = None) -> list[Run]:
    over = dict(DEMO_TRAIN, **(train_overrides or {}))
    return [Run(name, *preset(name), over, preset=name) for name in presets]
