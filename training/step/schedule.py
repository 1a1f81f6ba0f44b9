"""The learning-rate schedule, saved with the run so that a rerun continues it instead of
recomputing it from the new flags.

Linear warmup to the peak, then cosine decay to 10% of the peak at the last step. A rerun with
another `--steps` keeps the saved peak and warmup and *extends* the schedule: from the step where
the run stopped, the cosine decays from the learning rate it had reached to 10% of the peak at the
new last step. The learning rate is therefore continuous across the rerun and never re-warms; a
run that had already finished its decay continues at 10% of the peak.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training.config import TrainConfig

FINAL_FRACTION = 0.1  # of the peak, at the last step


@dataclass(frozen=True)
class Schedule:
    peak: float
    warmup: int
    total: int
    decay_from: int = 0  # step after which the (extended) decay starts; 0: right after warmup
    decay_start_lr: float | None = None  # the learning rate at `decay_from` (extensions only)

    @classmethod
    def from_config(cls, cfg: "TrainConfig") -> "Schedule":
        return cls(peak=cfg.lr, warmup=cfg.warmup_steps, total=cfg.steps)

    def lr(self, step: int) -> float:
        """Learning rate of optimizer step `step` (1-based)."""
        if self.warmup and step <= self.warmup:
            return self.peak * step / self.warmup
        start, start_lr = (self.decay_from, self.decay_start_lr) if self.decay_start_lr is not None \
            else (self.warmup, self.peak)
        low = FINAL_FRACTION * self.peak
        progress = min(1.0, (step - start) / max(1, self.total - start))
        return low + (start_lr - low) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def extended(self, total: int, at_step: int) -> "Schedule":
        """The schedule for a run that stopped after `at_step` and now trains to `total` steps."""
        if total == self.total:
            return self
        if at_step <= self.warmup and self.decay_start_lr is None:  # no decay happened yet
            return dataclasses.replace(self, total=total)
        return dataclasses.replace(self, total=total, decay_from=at_step,
                                   decay_start_lr=self.lr(at_step))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def resume_schedule(saved: dict, *, peak: float, warmup: int, total: int,
                    at_step: int) -> tuple[Schedule, list[str]]:
    """The saved schedule continued to `total` steps, and warnings for every flag it overrides."""
    schedule = Schedule(**saved)
    notes = []
    if (peak, warmup) != (schedule.peak, schedule.warmup):
        notes.append(f"--lr {peak} / --warmup-steps {warmup} differ from the run's saved schedule "
                     f"(peak {schedule.peak}, warmup {schedule.warmup}); keeping the saved ones "
                     "(use a new --name to start a new schedule)")
    if total != schedule.total:
        extended = schedule.extended(total, at_step)
        now, floor = schedule.lr(at_step), FINAL_FRACTION * schedule.peak
        where = f"--steps {total} differs from the schedule's {schedule.total} steps: "
        notes.append(where + (  # a finished decay has nowhere left to decay to
            f"holding lr {floor:.3e} (the schedule's floor) to step {total}, no re-warmup"
            if math.isclose(now, floor) else
            f"continuing from lr {now:.3e} at step {at_step}, cosine decay to {floor:.3e} at "
            f"step {total}, no re-warmup"))
        schedule = extended
    return schedule, notes
