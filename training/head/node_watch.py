"""While the run trains, the driver classifies each node event within seconds of its notice.

Why not at the end: a node that auto repair replaced is terminated and its Node object deleted
(EKS user guide, nodes/node-repair.adoc: Replace "terminate and replace the node"), so hours
later the summary could only say "drained". At the notice the Node still carries the monitoring
agent's condition (AcceleratedHardwareReady False, reason NvidiaXID<code>Error:
aws/eks-node-monitoring-agent monitors/nvidia/dcgm/dcgm_policies.go handleXidFinding,
pkg/manager/node_exporter.go Fatal), which repair waits on (10 minutes for that condition)
before it acts, so it is still there when the drain's eviction reaches the job; the job takes
its emergency checkpoint, then a worker records the event. The head is where the Kubernetes credentials are (the Ray pods'
service account, workloads/rbac.py); the workers never need them.

A daemon thread polls <run>/node-events/ every POLL_S seconds and writes each new record's
reason beside it (head/node_events.py classify_new). So that a repair is a repair even when its
Node is deleted right after the notice, or the poll comes late on a busy head, the thread also
reads, on each poll from the run's start, the Node of every worker pod of the run's Ray cluster
(RAY_CLUSTER_NAME in RAY_CLUSTER_NAMESPACE, which KubeRay sets in the head) and keeps what it
last showed; a node it cannot read at classification is judged by that, and one it neither
reads nor recalls is tried again on the next poll (node_events.SETTLE_S). It can never fail the run: any error is
printed once and the next poll tries again; it is stopped (and joined, briefly) after fit, and
records it missed are classified by the summary as before. Without a Kubernetes API (a laptop
run) there is nothing to ask and no thread starts.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator, Mapping

from training.head import node_events
from training.head.cold_start import CLUSTER_ENV, NAMESPACE_ENV, WORKER_SELECTOR
from training.head.kube_api import KubeAPI, KubeAPIError

POLL_S = 2.0
JOIN_S = 5.0  # after fit: at most this long for a poll in flight (its API reads time out at 3 s)


class NodeWatch(threading.Thread):
    """Classifies the run's new node events every `poll_s` until stopped."""

    def __init__(self, fs, run_dir: str, api: KubeAPI, poll_s: float = POLL_S,
                 cluster: tuple[str, str] | None = None):
        """`cluster`: (namespace, RayCluster name) whose workers' nodes are watched."""
        super().__init__(name="node-events", daemon=True)
        self.fs, self.run_dir, self.api, self.poll_s = fs, run_dir, api, poll_s
        self.cluster = cluster
        self.known: dict[str, node_events.Reason] = {}  # node -> what it last showed
        self.stopped = threading.Event()
        self.classified = 0
        self._said: set[str] = set()

    def run(self) -> None:
        while not self.stopped.wait(self.poll_s):
            self.sweep()

    def sweep(self) -> None:
        """One look; never raises."""
        try:
            self.remember()
        except KubeAPIError as e:  # the pods cannot be listed: classify at the notice only
            self._warn(f"nodes not watched now ({e})")
        try:
            self.classified += node_events.classify_new(self.fs, self.run_dir, self.api,
                                                        self.known)
        except Exception as e:  # noqa: BLE001 - the run must go on; the summary classifies later
            self._warn(f"node events not classified now ({e}); the summary will")

    def remember(self) -> None:
        """What each worker's Node shows now; a node that cannot be read keeps what it showed."""
        if self.cluster is None:
            return
        namespace, name = self.cluster
        pods = self.api.pods(namespace, WORKER_SELECTOR.format(cluster=name))
        for node in {p.get("spec", {}).get("nodeName") for p in pods} - {None}:
            try:
                self.known[node] = node_events.node_reason(self.api.node(node))
            except KubeAPIError:
                continue

    def _warn(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            print(f"WARNING: {text}", flush=True)


@contextlib.contextmanager
def watching(fs, run_dir: str, api: KubeAPI | None = None, poll_s: float = POLL_S,
             env: Mapping[str, str] = os.environ) -> Iterator[NodeWatch | None]:
    """A NodeWatch for the block's duration (the in-cluster API by default, the Ray cluster of
    `env`); None and no thread without an API."""
    api = api or node_events.head_api()
    if api is None:
        yield None
        return
    cluster = (env.get(NAMESPACE_ENV, "default"), env[CLUSTER_ENV]) if env.get(CLUSTER_ENV) \
        else None
    watch = NodeWatch(fs, run_dir, api, poll_s, cluster)
    watch.start()
    try:
        yield watch
    finally:
        watch.stopped.set()
        watch.join(JOIN_S)
