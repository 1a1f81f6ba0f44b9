"""The run's plan, made once on the driver in one pass before any cluster time is spent: the
settings checked, the model's shape, the LoRA adapters, the data tokenized (and the steps it
implies), the resume, and a memory check; then, once the Ray cluster is there and before Ray
Train starts a worker, the step's plan on the mesh the workers will form (`place`). The workers
read it from their WorkerInputs and plan nothing again."""

from __future__ import annotations

import dataclasses

from training.config import RANDOM_DATA, TrainConfig
from training.driver import checks, run_record
from training.run.handoff import RunPlan
from training.storage import Storage

GIB = 2**30


def build(cfg: TrainConfig, storage: Storage | None = None) -> tuple[RunPlan, Storage]:
    """The run's plan (not placed yet) and its storage (`storage`: resolved already). Every
    check that fails here costs no cluster time; the settings are recorded (run_record.record)
    only once nothing refused the run, by the driver."""
    from training.data.prepare import DataPlan, describe
    from training.evals import tasks as evals_tasks
    from training.model.lora import LoraSpec, count_on_meta, with_family_targets
    from training.storage import check_writable, resolve

    cfg = evals_tasks.checked(checks.absolute_paths(cfg))  # an unknown lm-eval task fails here
    enc = None if cfg.data in RANDOM_DATA else checks.check_data_and_tokenizer(cfg)
    model = checks.check_model(cfg, enc.vocab_size() if enc else None)
    cfg = with_family_targets(cfg, model)
    spec = LoraSpec.from_config(cfg)
    counts = count_on_meta(model, spec)  # LoRA targets the model lacks fail here
    _check_memory(cfg, model, counts, spec)
    storage = storage or resolve(cfg.storage_path)
    check_writable(storage)
    run_record.check(cfg, storage)  # the same --name, other defining settings
    data_plan = DataPlan.for_run(cfg, storage)
    data = data_plan.build(model.vocab_size) if data_plan else None
    if data is not None:
        checks.check_room(cfg, enc, data.data_format)
        cfg = dataclasses.replace(cfg, steps=data.steps)
    print(data.summary if data else describe(cfg, None, None), flush=True)
    resume = checks.check_resume(cfg, storage, data.fingerprint if data else cfg.data)
    return RunPlan(cfg, model, data, spec, *counts, resume=resume), storage


def _check_memory(cfg: TrainConfig, model, counts: tuple[int, int], spec) -> None:
    """A micro-batch that cannot fit --memory-budget-gib even at the frugal end of every lever
    is refused before Ray starts. The nodes are not known yet, so on the most favourable mesh
    the settings allow (plain FSDP over every worker, or --hsdp-replicas): a plan refused there
    is refused on any. `place` plans on the workers' own mesh."""
    from training.step.engine import plan_step
    from training.step.memory import HEADROOM
    from training.step.mesh import choose_layout

    if cfg.memory_budget_gib is None:
        return
    layout = choose_layout([""] * cfg.num_workers, cfg.hsdp_replicas)
    plan_step(cfg, model, counts, spec, layout, int(cfg.memory_budget_gib * GIB), on_gpu=True,
              headroom=HEADROOM, note=f" (--memory-budget-gib {cfg.memory_budget_gib})")


def place(plan: RunPlan, nodes: list[str], gpu_memory: int | None) -> RunPlan:
    """The plan with its step planned on the mesh the workers will form (`nodes[rank]`: the
    rank's node; one shard group per node on more than one, step/mesh.choose_layout) within a
    GPU's memory or --memory-budget-gib, the smaller (`gpu_memory` None: CPU workers, no
    limit). Refused, like a worker's OOM would be, when it cannot fit at all."""
    from training.step.engine import plan_step
    from training.step.mesh import choose_layout

    cfg = plan.cfg
    limit = gpu_memory
    if gpu_memory is not None and cfg.memory_budget_gib is not None:
        limit = min(int(cfg.memory_budget_gib * GIB), gpu_memory)  # as memory_limit_bytes
    layout = choose_layout(nodes, cfg.hsdp_replicas)
    step = plan_step(cfg, plan.model, (plan.num_params, plan.trainable_params), plan.lora,
                     layout, limit, on_gpu=gpu_memory is not None)
    return dataclasses.replace(plan, step=step)
