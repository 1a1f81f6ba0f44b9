"""Preemption notices during a run: a checkpoint at the step they interrupt, and the worker group
handed back to Ray Train, which restarts it from that checkpoint.

Ray Train 2.58 (the image's) does most of it: a PreemptionWatcher polls Ray's drain state every
RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S (5 s) and tells every worker (`ray.train.get_preemption_info`,
a collective); the controller, once a node of the run drains for preemption, waits until the
drain's deadline and then restarts the worker group, counting it on
`FailureConfig.max_preemption_failures`, apart from `max_failures` (train/v2/_internal/execution/
controller/controller.py, PreemptingState; failure_handling/default.py). The job's part
(`Preemptions`): at the first step boundary after a notice, a synchronous checkpoint of that step;
then the drain's deadline brought to now, so the restart comes at once instead of at the deadline.

One fact of Ray 2.58 needs more (`Keeper`): `ray start --block` (a KubeRay pod's PID 1) turns
SIGTERM into a drain of RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S and kills the node's processes at
that same instant (_private/node.py, _drain_node_before_shutdown). The workers then die with the
node death reason EXPECTED_TERMINATION, not AUTOSCALER_DRAIN_PREEMPTED, so `RayActorError.preempted`
is False (exceptions.py), and the controller, which looks for non-preemption errors before it
looks at the deadline, charges the restart to max_failures (seen on a local cluster: a run with
max_failures 0 failed). The keeper moves each drained node's deadline MARGIN_S earlier, so the
controller restarts the workers while they still live, as a preemption. A drain for preemption
cannot be rejected and a later request replaces its deadline (GcsClient.drain_node, as `ray
drain-node` calls it: scripts/scripts.py; the replacement was checked on a local cluster).
The keeper runs from the first line of every attempt (`keep_node`: while the model loads and
resumes, minutes for 7B, and with --checkpoint-every 0, where there is nothing to save but a
reclaim is still a preemption, not one of --max-failures), and a failed GCS call is retried,
never the end of its thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import ray
import ray.train

from training.pod_contract import RESTART_MARGIN_S
from training.run import node_notices
from training.run.run_files import RunFiles

REASON = "DRAIN_NODE_REASON_PREEMPTION"
KEEPER_POLL_S = 1.0


@dataclass(frozen=True)
class Notice:
    """A preemption of some of the run's nodes: their Ray node ids and the drain's deadline
    (Unix seconds; None: Ray Train then restarts 120 s after it noticed)."""

    nodes: tuple[str, ...]
    deadline: float | None

    def left_s(self) -> float | None:
        """Seconds until Ray Train restarts the workers at the latest: the keeper moves any
        deadline more than RESTART_MARGIN_S away that much earlier, and the watcher may have
        read it before the move, so such a deadline counts the margin off (never optimistic;
        at most the margin pessimistic)."""
        if self.deadline is None:
            return None
        left = self.deadline - time.time()
        return left - RESTART_MARGIN_S if left > RESTART_MARGIN_S else left


def drain(nodes: tuple[str, ...], deadline: float, why: str) -> None:
    """Drain `nodes` for preemption with this deadline (Unix seconds), replacing theirs."""
    from ray.core.generated import autoscaler_pb2

    gcs = ray._private.worker.global_worker.gcs_client
    for node in nodes:
        gcs.drain_node(node, autoscaler_pb2.DrainNodeReason.Value(REASON), why,
                       int(deadline * 1000))


class Keeper(threading.Thread):
    """On one worker of each node: once this node drains with a deadline more than MARGIN_S
    away, moves that deadline MARGIN_S earlier (the watcher's 5 s poll, the controller's 2 s poll
    and slack), so Ray Train acts before the node's processes go."""

    def __init__(self, node: str, margin_s: float = RESTART_MARGIN_S,
                 poll_s: float = KEEPER_POLL_S):
        super().__init__(daemon=True, name="preemption-keeper")
        self.node, self.margin_s, self.poll_s = node, margin_s, poll_s

    def run(self) -> None:
        while not self.moved():
            time.sleep(self.poll_s)

    def moved(self) -> bool:
        """One poll: whether this node's drain is handled (moved, or too close to move)."""
        try:
            deadline_ms = ray._private.state.state.get_draining_nodes().get(self.node)
            if not deadline_ms:  # 0: a drain without a deadline, which kills nothing
                return False
            if deadline_ms / 1000 - time.time() > self.margin_s:
                drain((self.node,), deadline_ms / 1000 - self.margin_s,
                      "training job: restart the workers before the node goes")
            return True
        except Exception:  # a GCS hiccup: polled again (Ray Train's own watcher retries too)
            return False


def keep_node() -> None:
    """At the start of an attempt, on the node's first worker: its Keeper, for the whole
    attempt."""
    if ray.train.get_context().get_local_rank() == 0:
        Keeper(ray.get_runtime_context().get_node_id()).start()


class Preemptions:
    """This attempt's side of a preemption: one emergency checkpoint, then the hand-back."""

    def __init__(self, enabled: bool, rank: int):
        self.enabled, self.rank = enabled, rank
        self.handled = False

    def poll(self) -> Notice | None:
        """Collective (every rank at every step boundary until one is handled): a notice not
        yet acted on, as rank 0 saw it."""
        if not self.enabled or self.handled:
            return None
        info = ray.train.get_preemption_info()
        if info is None:
            return None
        return Notice(tuple(info.preempted_node_ids),
                      info.deadline_ms / 1000 if info.deadline_ms else None)

    def save(self, notice: Notice, save_now: Callable[[], None], step: int) -> None:
        """Collective: `save_now()` (the synchronous checkpoint of `step`), then the drain's
        deadline brought to now, so Ray Train restarts the group from it at once."""
        self.handled = True
        left = notice.left_s()
        if self.rank == 0:
            print(f"preemption: node(s) {', '.join(notice.nodes)} go"
                  + (f", the restart in {left:.0f} s at the latest" if left is not None else "")
                  + f"; saving step {step}", flush=True)
        started = time.monotonic()
        save_now()
        took = time.monotonic() - started
        kube_nodes = node_notices.kube_nodes_of(notice.nodes)
        if self.rank == 0:
            drain(notice.nodes, time.time() + 1, "training job: checkpoint saved, restart now")
            try:  # the summary's record of it: never the end of the run
                node_notices.record(RunFiles.from_context(), notice.nodes, kube_nodes, step)
            except Exception as e:  # noqa: BLE001 - storage hiccup: the run goes on
                print(f"WARNING: the node event was not recorded: {e}", flush=True)
            left = notice.left_s()
            print(f"preemption: step {step} saved in {took:.1f} s"
                  + (f", {left:.0f} s before the deadline" if left is not None else "")
                  + "; Ray Train restarts the workers from it", flush=True)
