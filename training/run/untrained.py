"""Steps that train nothing: every micro-batch on every rank holds only untrained tokens (prompt
turns, or text cut off before its answer by a short --seq-len). The step's loss is then a mean
over no token, logged as 0; the loop warns instead of letting that 0 read as a perfect fit."""

from __future__ import annotations

import torch
import torch.distributed as dist

from training.model.loss import IGNORE_INDEX


class UntrainedSteps:
    """Records per step, on the host, whether this rank's micro-batches hold a trained token;
    `collect` (at log points, which sync anyway) names the steps no rank trained."""

    def __init__(self, device: torch.device):
        self.device = device
        self.steps: list[int] = []
        self.trained: list[int] = []

    def observe(self, step: int, micro: list) -> None:
        """`micro`: the step's micro-batches as the loader made them (host tensors: no sync)."""
        self.steps.append(step)
        self.trained.append(int(any(bool((m[1] != IGNORE_INDEX).any()) for m in micro)))

    def collect(self) -> list[int]:
        """Collective: the steps since the last call in which no rank had a trained token."""
        if not self.steps:
            return []
        trained = torch.tensor(self.trained, device=self.device)
        if dist.is_initialized():
            dist.all_reduce(trained, op=dist.ReduceOp.MAX)
        none = [s for s, t in zip(self.steps, trained.tolist()) if not t]
        self.steps, self.trained = [], []
        return none


def warning(steps: list[int], seq_len: int) -> str:
    listed = ", ".join(map(str, steps))
    return (f"WARNING: step{'s' if len(steps) > 1 else ''} {listed} trained no token (every "
            f"sample of the step holds only prompt text: --seq-len {seq_len} cuts the answers "
            "off their prompts); its loss 0 is a mean over nothing: raise --seq-len")
