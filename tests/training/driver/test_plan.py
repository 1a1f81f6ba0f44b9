"""The run plan the driver hands the workers is made on the mesh they will form: on two nodes
of four GPUs, one shard group per node (HSDP 2x4), not the plain FSDP over eight GPUs the
driver assumed before the nodes were known, whose batch plan differs."""

from __future__ import annotations

import dataclasses

from training.config import TrainConfig
from training.driver import plan as run_plan
from training.driver.placement import worker_nodes
from training.model.lora import count_on_meta
from training.model.model import model_config
from training.run.handoff import RunPlan
from training.step.engine import plan_step
from training.step.mesh import choose_layout

GIB = 2**30
HEAD = {"NodeID": "head", "Alive": True, "Resources": {"CPU": 8.0}}  # a CPU-only Ray head


def _gpu_node(name: str, gpus: int = 4, alive: bool = True) -> dict:
    return {"NodeID": name, "Alive": alive, "Resources": {"CPU": 48.0, "GPU": float(gpus)}}


def test_workers_pack_onto_the_fewest_gpu_nodes():
    nodes = [HEAD, _gpu_node("a"), _gpu_node("dead", alive=False), _gpu_node("b"),
             _gpu_node("c")]
    assert worker_nodes(nodes, "GPU", 8) == ["a"] * 4 + ["b"] * 4
    assert worker_nodes([HEAD, _gpu_node("a", 2), _gpu_node("b")], "GPU", 5) == \
        ["b"] * 4 + ["a"]


def test_the_plan_on_two_nodes_of_four_gpus_is_the_workers_mesh_not_plain_fsdp():
    cfg = TrainConfig(model="qwen2.5-1.5b", num_workers=8, seq_len=2048,
                      tokens_per_step=8 * 2048 * 4, memory_budget_gib=30.0)
    model = model_config(cfg.model)
    plan = RunPlan(cfg, model, None, None, *count_on_meta(model, None))
    nodes = worker_nodes([HEAD, _gpu_node("a"), _gpu_node("b")], "GPU", cfg.num_workers)
    placed = run_plan.place(plan, nodes, gpu_memory=140 * GIB).step
    # The workers' own choice from their host names (step/mesh.build_mesh), by default and
    # with the replica count the plan gives them (step/engine.build_engine).
    hosts = ["ray-worker-a"] * 4 + ["ray-worker-b"] * 4
    assert placed.mesh == choose_layout(hosts, None).shape == \
        choose_layout(hosts, placed.replicas).shape == "2x4"
    # What the driver checked before the nodes are known: plain FSDP over all 8 GPUs. It
    # accepts the run, with another batch plan than the one the workers' mesh needs.
    assumed = plan_step(cfg, model, (plan.num_params, plan.trainable_params), None,
                        choose_layout([""] * 8, None), 30 * GIB, on_gpu=True)
    assert assumed.mesh == "1x8" and (assumed.micro_batch_size, assumed.grad_accum) == (4, 1)
    assert (placed.micro_batch_size, placed.grad_accum) == (2, 2)  # a smaller shard group
    assert placed.batch.samples_per_step(8) == assumed.batch.samples_per_step(8)


def test_the_budget_and_the_gpu_limit_the_plan_the_smaller_wins():
    cfg = TrainConfig(model="qwen2.5-1.5b", num_workers=8, seq_len=2048,
                      tokens_per_step=8 * 2048 * 4)
    model = model_config(cfg.model)
    plan = RunPlan(cfg, model, None, None, *count_on_meta(model, None))
    nodes = ["a"] * 4 + ["b"] * 4
    on_h200 = run_plan.place(plan, nodes, gpu_memory=140 * GIB).step
    budgeted = run_plan.place(dataclasses.replace(plan, cfg=dataclasses.replace(
        cfg, memory_budget_gib=30.0)), nodes, gpu_memory=140 * GIB).step
    assert (on_h200.micro_batch_size, budgeted.micro_batch_size) == (4, 2)
    assert run_plan.place(plan, nodes, gpu_memory=None).step.compile is False  # CPU workers
