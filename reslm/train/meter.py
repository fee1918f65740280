"""The training segment's running sums between evaluations (`Meter`): what the loop logs as a segment's
train loss and a "step" row's window, and what a checkpoint between evaluations keeps of them."""
from __future__ import annotations

import time


class Meter:
    """The running sums of the training segment since the last evaluation: the summed train loss and
    its sample count from step `start` on, the window of step losses since the last "step" row, and the
    wall clocks of the segment's start, the last row and the last checkpoint. A checkpoint between
    evaluations keeps them (`state`), so a resumed run logs what an uninterrupted one does."""

    def __init__(self, start: int = 0, loss: float = 0.0, n: int = 0, seconds: float = 0.0,
                 win_loss: float = 0.0, win_steps: int = 0):
        self.start, self.loss, self.n, self.seconds = start, loss, n, seconds
        self.win_loss, self.win_steps = win_loss, win_steps
        self.start_clock()

    def start_clock(self) -> None:
        """The clocks start now (the segment's `seconds` so far already behind it)."""
        self.t_log = self.t_saved = time.perf_counter()   # wall clock at the last step row / checkpoint
        self.t_seg = self.t_log - self.seconds             # wall clock at the segment's start

    def add(self, loss: float, n: int) -> None:
        """One step's mean loss over its n samples."""
        self.loss, self.n = self.loss + loss * n, self.n + n
        self.win_loss, self.win_steps = self.win_loss + loss, self.win_steps + 1

    @property
    def train_loss(self) -> float:
        return self.loss / max(self.n, 1)

    @property
    def window_loss(self) -> float:
        return self.win_loss / self.win_steps

    def logged(self, now: float) -> None:
        """A step row was written: the window starts again."""
        self.win_loss, self.win_steps, self.t_log = 0.0, 0, now

    def restart(self, step: int) -> None:
        """An evaluation ends the segment: the next one starts at `step`."""
        self.loss, self.n, self.start, self.seconds, self.win_loss, self.win_steps = 0.0, 0, step, 0.0, 0.0, 0
        self.t_seg = self.t_log = self.t_saved = time.perf_counter()

    def state(self, now: float) -> dict:
        """What a checkpoint between evaluations keeps (Meter(**state) continues it)."""
        return dict(loss=self.loss, n=self.n, start=self.start, seconds=now - self.t_seg,
                    win_loss=self.win_loss, win_steps=self.win_steps)
