"""What the loop watches while it steps: the step clock (throughput, saves left out) and the
guard that stops a run whose loss or gradient norm is no longer finite."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


class StepClock:
    """Step times between log points, checkpoint saves left out. The run's first step carries
    warm-up (allocator, NCCL connections), so the compute rate leaves it out; the wall rate keeps
    everything since the attempt's first step began, saves included."""

    def __init__(self, tokens_per_step: int):
        self.tokens_per_step = tokens_per_step
        self.timed_time, self.timed_steps = 0.0, 0
        self.started, self.steps = time.perf_counter(), 0
        self.restart()

    def restart(self) -> None:
        self.window_start, self.window_steps = time.perf_counter(), 0

    def tick(self) -> None:
        """One more step in this window."""
        self.window_steps += 1
        self.steps += 1

    def lap(self, untimed: bool) -> float:
        """Seconds per step since the last lap (call after a device sync); an `untimed` window
        (the first step's warm-up, the profiled step) stays out of the run's rate."""
        elapsed = time.perf_counter() - self.window_start
        if not untimed:
            self.timed_time += elapsed
            self.timed_steps += self.window_steps
        return elapsed / self.window_steps

    def run_rate(self, fallback: float) -> float:
        return self.tokens_per_step * self.timed_steps / self.timed_time if self.timed_steps \
            else fallback

    def wall_rate(self) -> float:
        return self.tokens_per_step * self.steps / (time.perf_counter() - self.started)


class NonFiniteError(RuntimeError):
    """The loss or gradient norm stopped being finite; nothing after it is saved."""


class NonFiniteGuard:
    """Records, on the device and without a sync, the first step whose loss or gradient norm is
    not finite; `check` (at log and save points, which sync anyway) stops the run on every rank
    before anything from that step on is saved."""

    NONE = 2**62

    def __init__(self, device: torch.device):
        self.first_bad = torch.full((), self.NONE, dtype=torch.int64, device=device)

    def observe(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        # A Python scalar bound: no host-to-device copy, so no sync (unlike torch.tensor(step)).
        self.first_bad = torch.where(bad, self.first_bad.clamp(max=step), self.first_bad)

    def check(self, saved_step: int | None) -> None:
        first = self.first_bad.clone()
        if dist.is_initialized():
            dist.all_reduce(first, op=dist.ReduceOp.MIN)
        if int(first) != self.NONE:
            where = f"checkpoint step {saved_step}" if saved_step else "no checkpoint yet"
            raise NonFiniteError(
                f"the loss or gradient norm is not finite at step {int(first)}; stopped without "
                f"saving (the newest complete checkpoint: {where}); lower --lr, raise "
                "--warmup-steps or set --grad-clip, then rerun")
