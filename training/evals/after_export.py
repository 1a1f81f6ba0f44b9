"""The evaluation after the export (training/run/trainer.py calls `run` once the export is
written, on every worker): each model is loaded once, answers the sample prompts (rank 0) and is
scored by the harness (every rank, collective); then rank 0 writes samples.jsonl and harness.png
and returns what the summary and the tracker get. Nothing here fails the run: a failure is its
reason."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from training.config import TrainConfig
from training.evals import cost, harness, models, plot, samples


@dataclass(frozen=True)
class Evaluated:
    harness: dict | None = None  # {task: {metric: {"base", "tuned", "stderr": {"base", "tuned"}}}}
    harness_s: float | None = None  # both models' load, samples and scoring
    harness_nodes: int | None = None  # the hosts of the process group, for the cost
    harness_error: str | None = None
    samples_path: str | None = None
    log: list[str] = field(default_factory=list)

    def summary_fields(self) -> dict:
        return {"harness": self.harness, "harness_s": self.harness_s,
                "harness_nodes": self.harness_nodes, "harness_error": self.harness_error,
                "samples_path": self.samples_path}

    def metrics(self) -> dict[str, float]:
        """For the tracker: `harness/<task>/<metric>/<base|tuned>`."""
        return {f"harness/{task}/{metric}/{which}": v[which]
                for task, by_metric in (self.harness or {}).items()
                for metric, v in by_metric.items() for which in (models.BASE, models.TUNED)
                if isinstance(v[which], (int, float))}


def _shared(path: str | None) -> str | None:
    """rank 0's export path, on every rank."""
    if not dist.is_initialized():
        return path
    box = [path]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def run(cfg: TrainConfig, export_path: str | None, device, files) -> Evaluated | None:
    """Collective. `files`: rank 0's RunFiles (None elsewhere). None when nothing is asked."""
    if not (cfg.harness_tasks or cfg.sample_prompts):
        return None
    started = time.perf_counter()
    nodes = cost.world_nodes()  # collective: before anything can fail on one rank only
    try:
        return dataclasses.replace(_run(cfg, _shared(export_path), device, files, started),
                                   harness_nodes=nodes)
    except Exception as e:  # loading the export or a model: the run still succeeds
        return Evaluated(harness_s=time.perf_counter() - started, harness_nodes=nodes,
                         harness_error=harness.reason(e))


def _run(cfg: TrainConfig, export_path: str, device, files, started: float) -> Evaluated:
    from transformers import AutoTokenizer, GenerationConfig

    from training.model.loading import weights_dir

    export_dir = weights_dir(export_path)
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    generation = GenerationConfig.from_pretrained(export_dir)
    batch = samples.prompts(cfg, cfg.sample_prompts) if files and cfg.sample_prompts else []
    scores, answers, error = {}, {}, None
    for which, model in models.each(cfg, export_dir, device):
        if batch:
            answers[which] = samples.answer(model, tokenizer, generation, batch)
        if cfg.harness_tasks and error is None:
            result = harness.timed(lambda: harness.score(harness.ranked(model, tokenizer), cfg))
            scores[which], error = result.scores, result.error
    if files is None:
        return Evaluated()
    out = Evaluated(harness_s=time.perf_counter() - started, harness_error=error)
    if cfg.harness_tasks and error is None:
        out = Evaluated(harness=harness.side_by_side(scores[models.BASE], scores[models.TUNED]),
                        harness_s=out.harness_s)
        _write_plot(files, out.harness)
    if batch:
        table = samples.rows(batch, answers)
        with files.fs.open_output_stream(f"{files.run_dir}/{samples.SAMPLES_FILE}") as f:
            f.write(samples.render(table).encode())
        out = Evaluated(**{**out.summary_fields(), "samples_path": files.uri(samples.SAMPLES_FILE),
                           "log": samples.log_lines(table)})
    return out


def _write_plot(files, scores: dict) -> None:
    """harness.png next to metrics.png in the run directory (S3 or local), when a metric has
    both models' scores."""
    with tempfile.TemporaryDirectory() as d:
        png = Path(d, plot.PLOT_FILE)
        if plot.plot_harness(scores, png) is None:
            return
        with files.fs.open_output_stream(f"{files.run_dir}/{plot.PLOT_FILE}") as f:
            f.write(png.read_bytes())
