"""The EFA bandwidth floor: the warm-up probe's bus bandwidth against the instance type's floor
(stack/catalog.py, passed as --efa-floor-gbps), before the first step.

A link below the floor (a degraded EFA interface, a node pair outside the placement group, a
fallback the transport guard let through) makes every step slower for the whole run while every
GPU bills. With --strict-efa the job stops before its first step, naming both numbers and the
nodes; otherwise it warns with the slowdown the step-time model (training/step/step_time.py)
predicts against a link at the floor.

What is compared is the node's link, as the probe saw it (network/bandwidth.probe): on HSDP the
replicas' all-reduce crosses nodes, one replicate group per local rank at once over the node's
interfaces, so the link carries the sum of their bus bandwidths (the shard size times one
group's: bench/step_model.py g6_predictions shares it the same way); on plain FSDP the all-gather
over every rank crosses the slowest link, whose bus bandwidth it is. Every rank sees the slowest
rank's figure, so all reach the same verdict and fail (or go on) together.

The check adds one all_gather_object to the probe (on GPU a few 64 MiB collectives: well under a
second at the floor's bandwidth); rank 0 logs the time the probe and the check took.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from training.pod_contract import NODE_NAME_ENV
from training.step.metrics import peak_flops
from training.step.step_time import Links, StepPlan, predict

# The compute rate the prediction assumes: half the datasheet bf16 peak, the step model's default
# input (bench/MODEL.md; with it the model predicts the AWS sample's L4 run within 4.6%).
ASSUMED_MFU = 0.5


class LinkFloorError(RuntimeError):
    """The link between the run's nodes is below the instance type's floor (--strict-efa)."""


@dataclass(frozen=True)
class LinkCheck:
    """The verdict: the node link's bus bandwidth, the floor, the nodes, the predicted slowdown
    (step time at the measured link over the step time at the floor; None: not below it)."""
    link_gbps: float | None
    floor_gbps: float
    nodes: tuple[str, ...]
    slowdown: float | None
    compute_known: bool

    @property
    def below(self) -> bool:
        return self.link_gbps is not None and self.link_gbps < self.floor_gbps

    def describe(self) -> str:
        """One line for a link at or above the floor (or none: a single worker)."""
        if self.link_gbps is None:
            return "a single worker, no link to check"
        return f"{self.link_gbps:.2f} GB/s against a floor of {self.floor_gbps:.2f} GB/s"

    def message(self) -> str:
        pair = " and ".join(self.nodes) if len(self.nodes) <= 2 else ", ".join(self.nodes)
        text = (f"the link between {pair} gives {self.link_gbps:.2f} GB/s bus bandwidth, below "
                f"the floor of {self.floor_gbps:.2f} GB/s (--efa-floor-gbps)")
        if self.slowdown is not None:
            basis = "" if self.compute_known else (" (communication only: no datasheet peak "
                                                   "for this device, an upper bound)")
            text += (f"; the step-time model predicts each step {self.slowdown:.2f}x as long as "
                     f"at the floor{basis}")
        return text


def node_name() -> str:
    """This worker's Kubernetes node (downward API) or, off Kubernetes, its host name."""
    return os.environ.get(NODE_NAME_ENV) or socket.gethostname()


def node_link_gbps(probe: dict, replicas: int, shard: int) -> float | None:
    """The node link's bus bandwidth from one rank's probe (module docstring)."""
    if replicas > 1 and probe.get("allreduce_busbw_gbps") is not None:
        return probe["allreduce_busbw_gbps"] * shard
    return probe.get("allgather_busbw_gbps")


def links_at(link_gbps: float, probe: dict, replicas: int, shard: int) -> Links:
    """The step model's links with the node link at `link_gbps` (HSDP: shared by the shard's
    replicate groups; plain FSDP: the ring's)."""
    if replicas > 1:
        return Links(probe.get("allgather_busbw_gbps"), link_gbps / shard, separate=True)
    return Links(link_gbps, None, separate=False)


def slowdown(plan: StepPlan, compute_s: float, probe: dict, link_gbps: float,
             floor_gbps: float) -> float:
    """Predicted step time with the node link at `link_gbps` over that at `floor_gbps`."""
    at = lambda gbps: predict(plan, compute_s, links_at(gbps, probe, plan.replicas,
                                                        plan.shard)).step_s
    floor_s = at(floor_gbps)
    return at(link_gbps) / floor_s if floor_s > 0 else float("inf")


def compute_s_per_micro_batch(flops_per_token: float, tokens: int,
                              device_name: str | None) -> float | None:
    """Seconds of one micro-batch's forward and backward at ASSUMED_MFU of the datasheet peak;
    None where there is no peak (CPU, an unknown GPU)."""
    peak = peak_flops(device_name)
    return flops_per_token * tokens / (peak * ASSUMED_MFU) if peak else None


def decide(link_gbps: float | None, floor_gbps: float, nodes: tuple[str, ...], strict: bool,
           predicted: tuple[float, bool] | None) -> LinkCheck:
    """The verdict on the slowest rank's figure; raises LinkFloorError below the floor with
    `strict`. `predicted`: (slowdown, whether compute was known)."""
    check = LinkCheck(link_gbps, floor_gbps, nodes, None, True)
    if not check.below:
        return check
    check = LinkCheck(link_gbps, floor_gbps, nodes, *(predicted or (None, True)))
    if strict:
        raise LinkFloorError(check.message() + "; --strict-efa stops the run before its first "
                             "step (unset strictEfa to run on a slow link)")
    return check


def check(probe: dict, plan: StepPlan, floor_gbps: float, strict: bool,
          flops_per_token: float, device: torch.device) -> LinkCheck:
    """Collective: every rank's node and node-link figure gathered, the slowest judged."""
    mine = (node_name(), node_link_gbps(probe, plan.replicas, plan.shard))
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    nodes = tuple(dict.fromkeys(name for name, _ in gathered))
    figures = [gbps for _, gbps in gathered if gbps is not None]
    link = min(figures) if figures else None
    predicted = None
    if link is not None and link < floor_gbps:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        compute = compute_s_per_micro_batch(flops_per_token, plan.micro_batch * plan.seq_len,
                                            name)
        predicted = (slowdown(plan, compute or 0.0, probe, link, floor_gbps),
                     compute is not None)
    return decide(link, floor_gbps, nodes, strict, predicted)
