"""--harness-tasks: EleutherAI's lm-evaluation-harness (0.4.13) scores the base and the fine-tuned
model after the export, spread across the run's workers.

lm-eval's own HF model class (`HFLM`) runs the requests, so the scores are those of a standalone
`lm_eval --model hf` run of the same weights; it is given the loaded model and the export's
tokenizer. Given a model object, HFLM assumes one process (lm_eval/models/huggingface.py: "we forgo
distributed setup", rank 0 of 1), so `Ranked` gives it the worker's rank and world size and the
collectives `evaluate()` calls (`all_gather` of request counts, `gather_object` of the metrics,
`barrier`) over the process group Ray Train set up: each worker scores its share of every task
(`build_all_requests(rank=, world_size=)`) and rank 0 gets the aggregated results. A failure
(a task whose data cannot be read, say) is caught and returned as the reason: the export is
written already, so it never fails the run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from training.config import TrainConfig

BATCH_SIZE = 8  # requests per forward; lm-eval's "auto" would probe memory on every worker


@dataclass(frozen=True)
class HarnessResult:
    """One model's lm-eval `results`, the seconds its evaluation took, or why it failed."""
    scores: dict | None
    seconds: float
    error: str | None = None


def ranked(model, tokenizer):
    """An HFLM over `model` that knows this worker's place in the process group."""
    from lm_eval.models.huggingface import HFLM

    class Ranked(HFLM):
        def __init__(self):
            super().__init__(pretrained=model, tokenizer=tokenizer, batch_size=BATCH_SIZE)
            if dist.is_initialized():
                self._rank, self._world_size = dist.get_rank(), dist.get_world_size()

        def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
            if self.world_size <= 1:
                return tensor
            flat = tensor.reshape(-1)
            out = [torch.empty_like(flat) for _ in range(self.world_size)]
            dist.all_gather(out, flat)
            return torch.cat(out)

        def barrier(self) -> None:
            if self.world_size > 1:
                dist.barrier()

    return Ranked()


def score(lm, cfg: TrainConfig) -> dict | None:
    """Collective: lm-eval's results for `lm` on --harness-tasks (rank 0; None elsewhere)."""
    from lm_eval import simple_evaluate

    from training.evals.tasks import resolve

    tasks, manager = resolve(cfg.harness_tasks)
    out = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=cfg.harness_limit,
                          num_fewshot=cfg.harness_fewshot, log_samples=False,
                          random_seed=cfg.seed)
    return out["results"] if out else None


def _stderr(metrics: dict, metric: str, filt: str) -> float | None:
    """lm-eval's `<metric>_stderr,<filter>`; None where it is "N/A" (no bootstrap) or absent."""
    value = metrics.get(f"{metric}_stderr,{filt}")
    return value if isinstance(value, (int, float)) else None


def side_by_side(base: dict, tuned: dict) -> dict:
    """lm-eval's `results` ({task: {"acc,none": x, "acc_stderr,none": s, "alias": ...}}) of
    both models as {task: {metric: {"base": x, "tuned": y, "stderr": {"base": sb, "tuned": st}}}}:
    each model's score with its own stderr, so a difference reads against both. A metric under
    a filter other than `none` keeps it (`exact_match,strict-match`)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for task, metrics in tuned.items():
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key:
                continue
            metric, filt = key.split(",", 1)
            name = metric if filt == "none" else key
            theirs = base.get(task, {})
            out.setdefault(task, {})[name] = {
                "base": theirs.get(key), "tuned": value,
                "stderr": {"base": _stderr(theirs, metric, filt),
                           "tuned": _stderr(metrics, metric, filt)}}
    return out


def reason(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:500]


def timed(run) -> HarnessResult:
    """`run()` -> scores, timed, any failure caught as the result's reason."""
    started = time.perf_counter()
    try:
        scores = run()
    except Exception as e:  # the export is written: the run succeeds, the summary says why
        return HarnessResult(None, time.perf_counter() - started, reason(e))
    return HarnessResult(scores, time.perf_counter() - started)
