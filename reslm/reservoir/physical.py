"""Reservoir states -> measured states: the physical constraints of reading a substrate out.

A physical reservoir is read through sensors and an analogue-to-digital converter, so the readout
never sees the exact state r_t. `Physical` models that measurement, in physical order:

    m = r * (1 + g z_gain)              per-unit gain mismatch: z_gain ~ N(0, 1), one fixed draw per
                                        unit from the reservoir seed (part of the model, like W)
    m = m + sigma * z_t                 additive Gaussian measurement noise, fresh for every sample
    m = ADC_b(m)                        b-bit quantisation over the fixed range [-R, R] (clipped)

and the model then applies its parameter-free state normalisation (models/reservoir_lm.py) to m.

Choices (documented in the README's "Physical constraints"):

* Readout side only. The noise, gains and ADC act on what the readout sees; the state fed back into
  the dynamics stays exact (measurement noise, the issue's wording). In-loop noise would have to go
  inside every substrate's recurrence; it is left out.
* Substrate-agnostic: `Physical` only sees the (..., N) state a reservoir returns, so it serves every
  substrate in RESERVOIRS and both context modes.
* ADC: a mid-rise quantiser with 2^b levels over a fixed symmetric range [-R, R] (`adc_range`, default
  1, the range of tanh states), step D = 2R / 2^b, levels -R + (k + 1/2) D; inputs outside the range
  clip to the end levels, as a real converter saturates. A fixed range (not one calibrated on data)
  keeps the measurement a pure function of the config; substrates whose states are not in [-1, 1]
  (nvar, diagonal, delay) need their own `adc_range`.
* Noise is reproducible and independent across splits: row p of noise stream `key` is row p % BLOCK of
  randn(BLOCK, N) drawn from generator(seed, PHYSICAL_KEY, NOISE, *key, p // BLOCK). Precomputed
  features use the stream of their split (TRAIN with (cycle, shard): a shard's noise is drawn once per
  pass over it and reused by its epochs, like its states; TEST for training's evaluations and
  `reslm eval`, so both score the same noise) with p the sample's position in the split's text, so the
  draw does not depend on how the text is cut into pieces, on the context mode or on the device.
  forward() and step() (generation) use the ONLINE stream indexed by a reservoir clock: the number of
  reservoir steps since `reset()` (init_state); forward over a T-window runs ticks c .. c+T-1 and
  measures at the last, step() measures at its tick. So step() after init_state sees the same noise
  as forward() on the same window from a fresh clock (tested), and repeated window-mode predictions
  get fresh noise.

With every constraint off (the defaults) `Physical` returns its input tensor itself: the states are
bit-identical to those of a model without it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from reslm.core.errors import ReslmError
from reslm.reservoir.seeding import generator

PHYSICAL_KEY = 200          # seeding key of the measurement draws, apart from the matrices' (0-3) and training's (100)
GAIN, NOISE = 0, 1          # children of PHYSICAL_KEY
TRAIN, TEST, ONLINE, OTHER = 0, 1, 2, 3   # noise streams: training shards, test text, forward/step, anything else
BLOCK = 1024                # noise rows per generator
MAX_ADC_BITS = 16
FIELDS = ("gain_mismatch", "state_noise", "adc_bits", "adc_range")


def train_key(cycle: int, shard: int) -> tuple[int, ...]:
    """The noise stream of a training shard's features in cycle `cycle`."""
    return (TRAIN, cycle, shard)


TEST_KEY = (TEST,)
OTHER_KEY = (OTHER,)


def noise_stream(model, key: tuple[int, ...], offset: int) -> dict:
    """The `features` keywords that pick a measurement-noise stream (split `key`, the sample position
    the tokens start at), for models that measure through a `Physical`; {} for any other model."""
    return dict(noise_key=key, offset=offset) if isinstance(getattr(model, "physical", None), Physical) else {}


@dataclass(frozen=True)
class PhysicalConfig:
    gain_mismatch: float = 0.0      # g: per-unit gain 1 + g N(0, 1), fixed by the seed
    state_noise: float = 0.0        # sigma: additive Gaussian noise on the measured state
    adc_bits: int = 0               # b: ADC resolution, 2^b levels; 0 = no quantisation
    adc_range: float = 1.0          # R: the ADC reads [-R, R] and clips outside

    def validate(self) -> "PhysicalConfig":
        for name in ("gain_mismatch", "state_noise"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ReslmError(f"{name} must be a finite number >= 0, got {v!r}")
        if isinstance(self.adc_bits, bool) or not isinstance(self.adc_bits, int) \
                or not 0 <= self.adc_bits <= MAX_ADC_BITS:
            raise ReslmError(f"adc_bits must be an integer in 0..{MAX_ADC_BITS} (0 = off), got {self.adc_bits!r}")
        if not (isinstance(self.adc_range, (int, float)) and math.isfinite(self.adc_range) and self.adc_range > 0):
            raise ReslmError(f"adc_range must be a finite number > 0, got {self.adc_range!r}")
        return self

    @property
    def active(self) -> bool:
        return bool(self.gain_mismatch or self.state_noise or self.adc_bits)

    def describe(self) -> str:
        """One line for people: 'none' or the constraints that are on."""
        parts = ([f"gain mismatch {self.gain_mismatch:g}"] if self.gain_mismatch else []) \
            + ([f"state noise {self.state_noise:g}"] if self.state_noise else []) \
            + ([f"ADC {self.adc_bits} bits on [-{self.adc_range:g}, {self.adc_range:g}]"] if self.adc_bits else [])
        return ", ".join(parts) or "none"

    def tag(self) -> str:
        """A file-name-safe name of the settings, e.g. noise0.05-adc6-gain0."""
        tag = f"noise{self.state_noise:g}-adc{self.adc_bits}-gain{self.gain_mismatch:g}"
        return tag + (f"-range{self.adc_range:g}" if self.adc_range != 1.0 else "")


def quantize(x: torch.Tensor, bits: int, limit: float) -> torch.Tensor:
    """Mid-rise b-bit quantiser over [-limit, limit]: level k = clamp(floor((x + limit) / D), 0, 2^b - 1),
    value -limit + (k + 1/2) D with D = 2 limit / 2^b; |error| <= D / 2 inside the range."""
    levels = 2 ** bits
    step = 2 * limit / levels
    k = torch.floor((x + limit) / step).clamp_(0, levels - 1)
    return k.mul_(step).add_(step / 2 - limit)


class Physical(nn.Module):
    """The measurement of an N-unit reservoir's state: (..., N) states -> what the readout sees."""

    def __init__(self, cfg: PhysicalConfig, size: int, seed: int):
        super().__init__()
        self.config, self.size, self.seed = cfg.validate(), size, seed
        gain = None
        if cfg.gain_mismatch:
            gain = torch.empty(size)
            if not gain.is_meta:
                z = torch.randn(size, generator=generator(seed, PHYSICAL_KEY, GAIN), dtype=torch.float64)
                gain = (1 + cfg.gain_mismatch * z).float()
        # not saved with the weights: it is a function of (seed, g), so checkpoints stay as they were
        self.register_buffer("gain", gain, persistent=False)
        self.clock = 0              # reservoir steps since reset(): the ONLINE noise index

    def reset(self) -> None:
        self.clock = 0

    def noise(self, key: tuple[int, ...], start: int, rows: int, device=None) -> torch.Tensor:
        """Rows start .. start+rows-1 of noise stream `key`: (rows, N) standard normal, float32."""
        z = torch.empty(rows, self.size)
        for j in range(start // BLOCK, (start + rows - 1) // BLOCK + 1):   # the blocks the rows touch
            block = torch.randn(BLOCK, self.size, generator=generator(self.seed, PHYSICAL_KEY, NOISE, *key, j))
            a, b = max(start, j * BLOCK), min(start + rows, (j + 1) * BLOCK)
            z[a - start:b - start] = block[a - j * BLOCK:b - j * BLOCK]
        return z.to(device)

    def measure(self, s: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """Gain, then noise (a standard-normal tensor shaped like s, or None), then the ADC; float32 out.
        With every constraint off, s itself."""
        c = self.config
        if not c.active:
            return s
        m = s.float()
        if self.gain is not None:
            m = m * self.gain
        if c.state_noise:
            m = m + c.state_noise * noise
        if c.adc_bits:
            m = quantize(m, c.adc_bits, c.adc_range)
        return m

    def forward(self, s: torch.Tensor, key: tuple[int, ...], offset: int = 0) -> torch.Tensor:
        """Precomputed states (M, N), row i the sample at position offset + i of stream `key`."""
        noise = self.noise(key, offset, s.shape[0], s.device) if self.config.state_noise else None
        return self.measure(s, noise)

    def online(self, s: torch.Tensor, steps: int = 1) -> torch.Tensor:
        """A live measurement (B, N) after `steps` more reservoir steps (forward: the window length,
        step: 1), at tick clock + steps - 1 of the ONLINE stream; advances the clock."""
        tick = self.clock + steps - 1
        self.clock += steps
        noise = None
        if self.config.state_noise:
            noise = torch.randn(s.shape, generator=generator(self.seed, PHYSICAL_KEY, NOISE, ONLINE, tick)).to(s.device)
        return self.measure(s, noise)

    def extra_repr(self) -> str:
        return self.config.describe()
