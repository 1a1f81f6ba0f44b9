"""The EFA floor check on a real gloo group: the warm-up probe measures the local link, and a floor
set above what it measures is caught (with --strict-efa, on every rank, naming both numbers and
the nodes; without, a warning with the step model's slowdown) while a floor below it passes. On
CPU there is no EFA: the seam is the floor, never the measurement."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from stack.catalog import INSTANCES
from tests.training.inproc import run_ranks
from training.network import bandwidth, link_floor
from training.step.step_time import StepPlan

PLAN = StepPlan(params=1_000_000, layers=2, replicas=1, shard=2, reduce_dtype="fp32", zero2=True,
                micro_batch=1, grad_accum=1, seq_len=32)


def _probe_and_check(floors: list[tuple[float, bool]]) -> dict:
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("shard",))
    probe = bandwidth.probe(mesh, torch.device("cpu"), mib=1, iters=2)
    out = {"probe": probe, "verdicts": []}
    for floor, strict in floors:
        try:
            out["verdicts"].append(link_floor.check(probe, PLAN, floor, strict, 6e6,
                                                    torch.device("cpu")))
        except link_floor.LinkFloorError as e:
            out["verdicts"].append(str(e))
    return out


def test_a_link_below_the_floor_stops_with_strict_efa_warns_without_and_passes_above():
    # Floors around anything loopback gloo can give: 1e-6 GB/s below, 1e6 GB/s above.
    ranks = run_ranks(2, _probe_and_check, [(1e-6, True), (1e6, True), (1e6, False)])
    for r in ranks:
        passed, stopped, warned = r["verdicts"]
        assert not passed.below and passed.link_gbps > 1e-6
        assert isinstance(stopped, str) and "--strict-efa stops the run" in stopped
        assert f"below the floor of {1e6:.2f} GB/s" in stopped
        assert warned.below and warned.slowdown > 1 and "predicts each step" in warned.message()
    # Every rank judges the slowest rank's figure: the same verdict on all.
    assert ranks[0]["verdicts"][0].link_gbps == ranks[1]["verdicts"][0].link_gbps


def test_the_node_link_is_the_sum_of_the_replicate_groups_on_hsdp():
    probe = {"allgather_busbw_gbps": 10.0, "allreduce_busbw_gbps": 0.5}
    assert link_floor.node_link_gbps(probe, replicas=2, shard=4) == 2.0
    assert link_floor.node_link_gbps(probe, replicas=1, shard=8) == 10.0


def test_the_predicted_slowdown_grows_as_the_link_falls_and_vanishes_when_compute_hides_it():
    hsdp = StepPlan(params=1_500_000_000, layers=28, replicas=2, shard=4, reduce_dtype="bf16",
                    zero2=True, micro_batch=1, grad_accum=16, seq_len=2048)
    probe = {"allgather_busbw_gbps": 10.0}
    mild = link_floor.slowdown(hsdp, 0.3, probe, link_gbps=2.0, floor_gbps=2.5)
    bad = link_floor.slowdown(hsdp, 0.3, probe, link_gbps=0.5, floor_gbps=2.5)
    assert 1 < mild < bad
    assert link_floor.slowdown(hsdp, 1e3, probe, 2.0, 2.5) == pytest.approx(1, abs=1e-3)


def test_a_single_worker_has_no_link_to_check():
    verdict = link_floor.decide(None, 2.5, ("node-a",), strict=True, predicted=None)
    assert not verdict.below and "single worker" in verdict.describe()


def test_every_efa_instance_type_has_a_floor_that_says_its_basis():
    for name, facts in INSTANCES.items():
        assert (facts.efa_floor_gbps is None) == (facts.efa_interfaces == 0), name
        if facts.efa_floor_gbps:
            assert facts.efa_floor_basis.startswith(("measured", "derived")), name
            assert facts.efa_floor_gbps < facts.network_gbps / 8, name
    assert INSTANCES["g6.12xlarge"].efa_floor_gbps == 2.5
