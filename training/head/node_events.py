"""The run's node events: every drain of its nodes that the job handled as a preemption (a spot
reclaim, a node repair, any other drain), persisted in the run's storage as it happens, so the
summary lists them across attempts with their times.

A node repair reaches the job the way a spot reclaim does. What the EKS user guide says
(awsdocs/amazon-eks-user-guide, latest/ug/nodes/node-health.adoc, node-repair.adoc,
managed-node-groups.adoc): auto repair cordons a node whose health check fails ("the node is
automatically cordoned so that no new Pods are scheduled on the node"); it acts on the
monitoring agent's AcceleratedHardwareReady after 10 minutes, on the other conditions after 30;
its actions are Replace ("terminate and replace the node") or, on managed node groups, Reboot;
and managed node groups drain "using the Kubernetes API during terminations or updates" (an
eviction: SIGTERM to the pod's `ray start --block`, which drains its Ray node for preemption,
workloads/raycluster.py; the same path as a reclaim, preemption.py, the same emergency
checkpoint, the same budget). NOT confirmed by the guide: that a repair's Replace drains the
way a termination does, whether that drain honours PodDisruptionBudgets and the pod's
terminationGracePeriodSeconds (its PDB note covers AZRebalance and scale-in only: evictions, and
termination regardless after 15 minutes), and whether a Reboot drains at all. A Reboot without
a drain kills the workers without a notice: Ray Train then restarts from the last periodic
checkpoint, charged to --max-failures, and no node event is recorded.

The workers record each notice (run/node_notices.py); the driver, on the head, classifies each
one within seconds of its notice (head/node_watch.py), while the Node object still shows why:
a node that repair replaced is deleted soon after, and at summary time reads as "drained". It
reads each drained node's Node object (the Ray pods' service account may `get` nodes:
workloads/rbac.py). A node whose monitoring-agent condition (REPAIR_CONDITIONS) is False, or
whose Ready is not True, is a repair; a node of a Spot capacity type (EKS labels managed nodes
`eks.amazonaws.com/capacityType`) is a spot reclaim; anything else, or a node the API cannot
tell about, is "drained". Never an error: a failed read only makes the reason "drained".
"""

from __future__ import annotations

import json
import time
from typing import Mapping

from training.head.kube_api import KubeAPI, KubeAPIError
from training.run.node_notices import EVENTS_DIR

# The node monitoring agent's conditions (EKS user guide, nodes/node-repair.adoc) and Ready.
REPAIR_CONDITIONS = ("AcceleratedHardwareReady", "ContainerRuntimeReady", "KernelReady",
                     "NetworkingReady", "StorageReady")
CAPACITY_LABEL = "eks.amazonaws.com/capacityType"
# How long after a notice the watch keeps trying a node it cannot read or recall (a repair
# deletes it within minutes of its drain; a busy API answers within seconds).
SETTLE_S = 60.0
KUBE_TIMEOUT_S = 3.0  # per node: a slow API only costs the reason, never the run or its summary
REASON_SUFFIX = ".reason.json"  # beside each record: its reason, written when it was classified


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


Reason = tuple[str, "str | None"]


def classify(kube_nodes: tuple[str, ...], api: KubeAPI | None,
             known: Mapping[str, Reason] | None = None) -> Reason:
    """The first telling reason among the nodes; "drained" without the API or on any error."""
    return classified(kube_nodes, api, known)[0]


def classified(kube_nodes: tuple[str, ...], api: KubeAPI | None,
               known: Mapping[str, Reason] | None = None) -> tuple[Reason, bool]:
    """(reason, settled). A node that cannot be read now (deleted by a Replace right after
    the notice, a read that timed out on a busy API) takes its reason from `known`, what the
    watch saw of it before (NodeWatch); without one the reason is "drained" and not settled:
    the watch tries again on its next poll instead of writing it down."""
    if api is None:
        return ("drained", "no Kubernetes API here"), True
    found: Reason = ("drained", None)
    settled = True
    for name in kube_nodes:
        try:
            reason = node_reason(api.node(name))
        except (KubeAPIError, KeyError, TypeError) as e:
            reason = (known or {}).get(name) or ("drained", f"node {name}: {e}")
            settled = settled and name in (known or {})
        if reason[0] == "repair":
            return reason, True
        if reason[0] == "spot-reclaim":
            found = reason
    return found, settled


def head_api() -> KubeAPI | None:
    """The in-cluster API with a short timeout; None off Kubernetes."""
    api = KubeAPI.in_cluster()
    return api and KubeAPI(api.base_url, api.token_file, api.ca_file, KUBE_TIMEOUT_S)


def _read_json(fs, path: str) -> dict:
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())


def _listing(fs, run_dir: str) -> tuple[dict[str, dict], set[str]]:
    """The records (path -> record) and the paths of the reason files beside them."""
    import pyarrow.fs as pafs

    base = f"{run_dir.rstrip('/')}/{EVENTS_DIR}"
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    except OSError:
        return {}, set()
    files = {i.path for i in infos if i.is_file and i.path.endswith(".json")}
    reasons = {p for p in files if p.endswith(REASON_SUFFIX)}
    return {p: _read_json(fs, p) for p in sorted(files - reasons)}, reasons


def _reason_path(record_path: str) -> str:
    return record_path.removesuffix(".json") + REASON_SUFFIX


def _classified(record: dict, api: KubeAPI | None,
                known: Mapping[str, Reason] | None = None) -> tuple[dict, bool]:
    (reason, detail), settled = classified(tuple(record["kube_nodes"]), api, known)
    return {"reason": reason, "detail": detail, "classified_at": time.time()}, settled


def classify_new(fs, run_dir: str, api: KubeAPI | None,
                 known: Mapping[str, Reason] | None = None, settle_s: float | None = None) -> int:
    """Classify every record that has no reason yet and write its reason beside it, so it
    stays what the Node showed at the time; returns how many were classified. A record whose
    nodes cannot be read or recalled now is left for the next call, up to `settle_s` after
    its notice (then "drained", with the error)."""
    settle_s = SETTLE_S if settle_s is None else settle_s
    records, reasons = _listing(fs, run_dir)
    written = 0
    for path in (p for p in records if _reason_path(p) not in reasons):
        result, settled = _classified(records[path], api, known)
        if not settled and time.time() - records[path]["time"] < settle_s:
            continue
        with fs.open_output_stream(_reason_path(path)) as f:
            f.write(json.dumps(result).encode())
        written += 1
    return written


def read_all(fs, run_dir: str, api: KubeAPI | None = None) -> list[dict]:
    """Every recorded notice of the run, oldest first, each with its reason, detail and when it
    was classified (the driver's summary): the reason written at the notice, or, for one not
    classified yet, read now (`api` defaults to the in-cluster one); [] when there are none."""
    records, reasons = _listing(fs, run_dir)
    events = []
    for path, record in records.items():
        if _reason_path(path) in reasons:
            record.update(_read_json(fs, _reason_path(path)))
        else:
            api = api or head_api()
            record.update(_classified(record, api)[0])
        events.append(record)
    return sorted(events, key=lambda e: e["time"])
