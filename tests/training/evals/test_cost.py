"""The evaluation's GPU-node dollars: the workers' node count and seconds, priced by the driver
with the GPU instance's price the stack gives the head, None where no price is given (a local
run)."""

from __future__ import annotations

import json

import pyarrow.fs as pafs
import pytest
import torch.distributed as dist

from stack.catalog import region_prices
from tests.training import inproc
from training.config import TrainConfig
from training.driver import cli
from training.evals import cost
from training.head.cold_start import PRICE_ENV
from training.run.handoff import SUMMARY_FILE, RunPlan, RunSummary
from training.storage import Storage


def test_dollars_are_nodes_times_price_times_hours():
    assert cost.gpu_node_usd(90.0, 2, 4.6) == pytest.approx(2 * 4.6 * 90 / 3600)
    assert cost.gpu_node_usd(90.0, 2, None) is None  # no price: a local run
    assert cost.gpu_node_usd(None, 2, 4.6) is None  # no evaluation


def test_the_driver_prices_the_evaluation_with_the_heads_gpu_price(tmp_path, monkeypatch):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / SUMMARY_FILE).write_text(json.dumps(
        RunSummary(steps=3, harness_s=720.0, harness_nodes=2).to_dict()))
    storage = Storage(str(tmp_path), str(tmp_path), pafs.LocalFileSystem())
    plan = RunPlan(cfg=TrainConfig(name="r"), model=None, data=None, lora=None, num_params=0,
                   trainable_params=0)
    price = region_prices("us-east-1")[0]["g6.12xlarge"]
    monkeypatch.setenv(PRICE_ENV, str(price))  # as workloads/scaleup_watch.py sets the head's
    assert cli._summary(None, storage, plan).harness_gpu_node_usd == \
        pytest.approx(2 * price * 720 / 3600, abs=1e-4)
    monkeypatch.delenv(PRICE_ENV)
    assert cli._summary(None, storage, plan).harness_gpu_node_usd is None


def _count_nodes(rank: int, world: int, store: str, hosts: list[str], out: str) -> None:
    import socket

    socket.gethostname = lambda: hosts[rank]  # this rank's pod
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        with open(f"{out}.{rank}", "w") as f:
            f.write(str(cost.world_nodes()))
    finally:
        dist.destroy_process_group()


def test_the_nodes_are_the_process_groups_distinct_hosts_not_its_ranks(tmp_path):
    assert cost.world_nodes() == 1  # no group: this process
    hosts = ["gpu-a", "gpu-a", "gpu-b"]  # three workers on two GPU nodes
    inproc.start(_count_nodes, (3, str(tmp_path / "store"), hosts, str(tmp_path / "n")), 3)
    assert [(tmp_path / f"n.{r}").read_text() for r in range(3)] == ["2", "2", "2"]
