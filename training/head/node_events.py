"""The run's node events: every drain of its nodes that the job handled as a preemption (a spot
reclaim, a node repair, any other drain), persisted in the run's storage as it happens, so the
summary lists them across attempts with their times.

A node repair reaches the job the way a spot reclaim does. EKS node auto repair cordons a node
whose health check fails ("If a health check fails, the node is automatically cordoned") and acts
on the monitoring agent's conditions after 10 minutes (AcceleratedHardwareReady) or 30 (the
others); a Replace terminates the instance, and managed node groups drain a node through the
Kubernetes API (eviction) before it terminates (EKS user guide, nodes/node-health.adoc,
node-repair.adoc, managed-node-groups.adoc). The eviction sends SIGTERM to the pod's `ray start
--block`, which drains its Ray node for preemption (workloads/raycluster.py): the same path
as a reclaim (preemption.py), the same emergency checkpoint, the same budget.

The workers record each notice (run/node_notices.py); the driver, on the head, classifies them
when it writes the summary. Telling them apart: it reads each drained node's Node object (the Ray pods'
service account may `get` nodes: workloads/rbac.py). A node whose monitoring-agent condition
(REPAIR_CONDITIONS) is False, or whose Ready is not True, is a repair; a node of a Spot
capacity type (EKS labels managed nodes `eks.amazonaws.com/capacityType`) is a spot reclaim;
anything else, or a node the API cannot tell about, is "drained". Never an error: a failed
read only makes the reason "drained". A node that repair replaced is gone by then (its Node
deleted): "drained", with the 404 as its detail; a rebooted one may be healthy again.
"""

from __future__ import annotations

import json

from training.head.kube_api import KubeAPI, KubeAPIError
from training.run.node_notices import EVENTS_DIR
# The node monitoring agent's conditions (EKS user guide, nodes/node-repair.adoc) and Ready.
REPAIR_CONDITIONS = ("AcceleratedHardwareReady", "ContainerRuntimeReady", "KernelReady",
                     "NetworkingReady", "StorageReady")
CAPACITY_LABEL = "eks.amazonaws.com/capacityType"
KUBE_TIMEOUT_S = 3.0  # per node: a slow API only costs the reason, never the summary


def node_reason(node: dict) -> tuple[str, str | None]:
    """(reason, detail) from a Node object, as the module docstring says."""
    for c in node.get("status", {}).get("conditions", []):
        failed = (c.get("type") in REPAIR_CONDITIONS and c.get("status") == "False") or \
                 (c.get("type") == "Ready" and c.get("status") != "True")
        if failed:
            return "repair", f"{c['type']}={c.get('status')} ({c.get('reason') or 'no reason'})"
    capacity = node.get("metadata", {}).get("labels", {}).get(CAPACITY_LABEL)
    if capacity == "SPOT":
        return "spot-reclaim", f"{CAPACITY_LABEL}=SPOT"
    return "drained", None


def classify(kube_nodes: tuple[str, ...], api: KubeAPI | None) -> tuple[str, str | None]:
    """The first telling reason among the nodes; "drained" without the API or on any error."""
    if api is None:
        return "drained", "no Kubernetes API here"
    found = ("drained", None)
    for name in kube_nodes:
        try:
            reason = node_reason(api.node(name))
        except (KubeAPIError, KeyError, TypeError) as e:
            reason = ("drained", f"node {name}: {e}")
        if reason[0] == "repair":
            return reason
        if reason[0] == "spot-reclaim":
            found = reason
    return found


def read_all(fs, run_dir: str, api: KubeAPI | None = None) -> list[dict]:
    """Every recorded notice of the run, oldest first, each with its reason and detail (the
    driver's summary); [] when there are none. `api` defaults to the in-cluster one."""
    import pyarrow.fs as pafs

    base = f"{run_dir.rstrip('/')}/{EVENTS_DIR}"
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    except OSError:
        return []
    events = []
    for info in infos:
        if info.is_file and info.path.endswith(".json"):
            with fs.open_input_stream(info.path) as f:
                events.append(json.loads(f.read().decode()))
    if events and api is None:
        api = KubeAPI.in_cluster()
        api = api and KubeAPI(api.base_url, api.token_file, api.ca_file, KUBE_TIMEOUT_S)
    for e in events:
        e["reason"], e["detail"] = classify(tuple(e["kube_nodes"]), api)
    return sorted(events, key=lambda e: e["time"])
