"""Why the run's GPU workers are not coming, read from cluster-autoscaler, and the end of a run
that cannot start, so no GPU bills for it.

KubeRay submits the job only once every pod of the run's cluster runs (rayjob_controller.go waits
for RayCluster state `ready`), so while GPU nodes are missing no job exists yet: this watch runs
beside the Ray head from the head's start (`python -m training.head.scaleup`, a container of the head
pod: workloads/scaleup_watch.py) and reads, every poll, the worker pods, their events and the
autoscaler's status ConfigMap.

What cluster-autoscaler 1.35 writes (kubernetes/autoscaler, tag cluster-autoscaler-1.35.2):
- pod events `TriggeredScaleUp` "pod triggered scale-up: [{GROUP 0->2 (max: 2)}]" and
  `NotTriggerScaleUp` "pod didn't trigger scale-up: 1 max node group size reached, 1 in backoff
  after failed scale-up, ..." (processors/status/eventing_scale_up_processor.go; the reasons in
  core/scaleup/orchestrator/skippedreasons.go, predicate failures from the scheduler framework);
- ConfigMap kube-system/cluster-autoscaler-status, key `status`, YAML of
  clusterstate/api/types.go ClusterAutoscalerStatus: per node group `scaleUp.status` `Backoff`
  with `backoffInfo.errorCode`/`errorMessage` after a failed scale-up (clusterstate.go
  buildScaleUpStatusNodeGroup). On AWS a failed launch is errorCode `placeholder-cannot-be-
  fulfilled`, "AWS cannot provision any more instances for this node group" (cloudprovider/aws
  aws_cloud_provider.go Nodes: the ASG's scaling activity failed, auto_scaling_groups.go
  isNodeGroupAvailable). EC2's own reason (InsufficientInstanceCapacity, VcpuLimitExceeded, a
  launch-template error) is only in the ASG's activity and the autoscaler's log, never in
  Kubernetes, so the fix names the command that shows it. Nodes that launch but do not register
  within `--max-node-provision-time` (15 min) back off with errorCode `timeout`.
The failure events, `ScaleUpFailed` "Failed adding N nodes to group G due to OutOfResource.
placeholder-cannot-be-fulfilled; source errors: ..." and `ScaleUpTimedOut` (1.35 has no
`FailedScaleUp` reason), are recorded on the status ConfigMap itself (clusterstate.go through
clusterstate/utils/status.go LogEventRecorder), so they live in kube-system; the same failure is
the group's `backoffInfo`, which one `get` of the ConfigMap reads without listing kube-system's
events.

The watch goes on after every worker has a node: a worker pod that is Pending again mid-run (its
spot node reclaimed, a node lost) is diagnosed the same way, and a definite cause (no spot
capacity left for the type in the zone, the Spot quota) ends the run with it; the run resumes
from its last checkpoint when started again. The fixes name the GPU nodes' capacity type and
quota (`Market`), which the head pod's environment carries from stack/catalog.py.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import yaml

from training.head.cold_start import (CLUSTER_ENV, NAMESPACE_ENV, RAYJOB_ENV, WORKER_SELECTOR,
                                 event_time, parse_time)
from training.head.kube_api import KubeAPI, KubeAPIError

STATUS_NAMESPACE, STATUS_CONFIGMAP = "kube-system", "cluster-autoscaler-status"
POLL_S = 15.0
# The annotation the end of a run leaves on its RayJob (kubectl describe rayjob shows it).
CAUSE_ANNOTATION = "eks-ray-train/scale-up-failure"
# Reasons of a node group that may clear up by themselves (skippedreasons.go): no verdict yet.
TRANSIENT = ("max node group size reached", "max total nodes in cluster reached",
             "not ready for scale-up", "atomic scale-up exceeds cluster node count limit")
BACKOFF = "in backoff after failed scale-up"
# What the head pod's environment says of the GPU nodes (workloads/scaleup_watch.py).
CAPACITY_TYPE_ENV, QUOTA_ENV = "GPU_CAPACITY_TYPE", "GPU_VCPU_QUOTA"


@dataclass(frozen=True)
class Market:
    """How the GPU nodes are bought: the capacity type as the stack spells it (`on-demand`,
    `spot`, `capacity-block`), and the vCPU quota (name and code) their launches count against,
    both as the head pod's environment carries them from the stack's one capacity record
    (stack/catalog.py GpuCapacity, rendered by workloads/scaleup_watch.py); the fixes of a failed
    launch follow from it. No quota: the environment names none (a family or capacity without
    one in the catalog, or a head outside the stack's pods)."""

    capacity_type: str = "on-demand"
    quota: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Market":
        return cls(env.get(CAPACITY_TYPE_ENV) or cls.capacity_type, env.get(QUOTA_ENV) or None)

    def quota_fix(self) -> str:
        which = f"'{self.quota}'" if self.quota else "the vCPU quota of the instance's family"
        return (f"request more vCPUs in Service Quotas (EC2, {which}: gpuNodeCount x the "
                "instance's vCPUs)")

    def capacity_fix(self) -> str:
        if self.capacity_type == "spot":
            return ("spot capacity for one instance type in one zone comes and goes: try again "
                    "later (the run resumes from its last checkpoint), set gpuAvailabilityZone "
                    "to another zone that offers the type, or set gpuCapacityType on-demand")
        return ("set gpuAvailabilityZone to another zone that offers the type, use a "
                "capacityReservation or capacityBlock, or try again later")


@dataclass(frozen=True)
class Cause:
    """Why the workers are not coming. `definite`: it will not clear up by waiting."""

    summary: str
    fix: str
    definite: bool

    def line(self) -> str:
        verdict = "the run cannot start" if self.definite else "still waiting"
        return f"scale-up: {self.summary} ({verdict}); fix: {self.fix}"


def node_group_status(config_map: dict | None) -> list[dict]:
    """The `nodeGroups` of the autoscaler's status YAML (empty when absent or unreadable)."""
    text = ((config_map or {}).get("data") or {}).get("status")
    try:
        status = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return []
    return (status or {}).get("nodeGroups") or [] if isinstance(status, dict) else []


def _latest(events: list[dict], reason: str) -> dict | None:
    """The event of this reason seen last (a repeated event keeps one object, counted)."""
    mine = [e for e in events if e.get("reason") == reason]
    return max(mine, key=lambda e: parse_time(e.get("lastTimestamp")) or event_time(e) or 0.0) \
        if mine else None


def triggered_groups(events: list[dict]) -> set[str]:
    """Node groups named by `TriggeredScaleUp` ("[{eks-gpu-1a2b 0->2 (max: 2)}]")."""
    return {m for e in events if e.get("reason") == "TriggeredScaleUp"
            for m in re.findall(r"\{(\S+) \d+->\d+", e.get("message", ""))}


def not_triggered_reasons(message: str) -> list[str]:
    """"pod didn't trigger scale-up: 1 max node group size reached, 2 Insufficient cpu" ->
    ["max node group size reached", "Insufficient cpu"]."""
    body = message.split(":", 1)[1] if ":" in message else message
    return [re.sub(r"^\d+ ", "", r.strip()) for r in body.split(", ") if r.strip()]


def _backoff_cause(group: dict, market: Market) -> Cause:
    info = group.get("scaleUp", {}).get("backoffInfo") or {}
    code, message, name = info.get("errorCode", ""), info.get("errorMessage", ""), group["name"]
    check = (f"aws autoscaling describe-scaling-activities --auto-scaling-group-name {name} "
             "--max-items 3")
    if code == "placeholder-cannot-be-fulfilled":
        return Cause(f"EC2 launched no instance for node group {name}: {message}",
                     f"see EC2's reason with `{check}`; InsufficientInstanceCapacity or "
                     f"UnfulfillableCapacity: {market.capacity_fix()}; VcpuLimitExceeded or "
                     f"MaxSpotInstanceCountExceeded: {market.quota_fix()}", True)
    if code == "timeout":
        return Cause(f"nodes of group {name} launched but never joined the cluster: {message}",
                     "read the instance's console output (aws ec2 get-console-output) for the "
                     "node bootstrap error, and check the node role and the subnets' route to "
                     "the EKS endpoint", True)
    return Cause(f"node group {name} is in backoff after a failed scale-up: {code} {message}",
                 f"see `{check}` and `kubectl -n kube-system logs deploy/cluster-autoscaler`",
                 True)


def diagnose(pods: list[dict], events: list[dict], config_map: dict | None,
             market: Market = Market()) -> Cause | None:
    """The cause for the pending worker pods, or None when none is pending."""
    pending = [p for p in pods if p.get("status", {}).get("phase") == "Pending"
               and not p.get("spec", {}).get("nodeName")]
    if not pending:
        return None
    uids = {p["metadata"]["uid"] for p in pending}
    mine = [e for e in events if e.get("involvedObject", {}).get("uid") in uids]
    groups = node_group_status(config_map)
    named = triggered_groups(mine)
    backoff = [g for g in groups if g.get("scaleUp", {}).get("status") == "Backoff"
               and (not named or g.get("name") in named)]
    last = _latest(mine, "NotTriggerScaleUp")
    reasons = not_triggered_reasons(last.get("message", "")) if last else []
    if backoff and (named or BACKOFF in reasons):
        return _backoff_cause(backoff[0], market)
    if last and any(r.startswith(t) for r in reasons for t in TRANSIENT):
        return Cause(f"cluster-autoscaler does not scale up yet: {', '.join(reasons)}",
                     "wait for the nodes of an earlier run to go (kubectl get nodes), or check "
                     "that gpuNodeCount covers the run's worker pods", False)
    if last and reasons and BACKOFF not in reasons:
        return Cause("no node group can hold a worker pod, by cluster-autoscaler's node "
                     f"templates: {', '.join(reasons)}",
                     "check the GPU node group's labels, taint and node-template tags "
                     "(k8s.io/cluster-autoscaler/node-template/...) against the worker pod's "
                     "node selector and requests (kubectl -n ray describe pod)", True)
    if named:
        return Cause(f"scale-up of {', '.join(sorted(named))} in progress", "none needed", False)
    return Cause("no scale-up decision from cluster-autoscaler yet",
                 "if this lasts, check it runs: kubectl -n kube-system logs "
                 "deploy/cluster-autoscaler", False)


def read_cause(api: KubeAPI, namespace: str, cluster: str,
               market: Market = Market()) -> tuple[Cause | None, int]:
    """The cause now, and how many worker pods exist (0: KubeRay has not made them yet)."""
    pods = api.pods(namespace, WORKER_SELECTOR.format(cluster=cluster))
    try:
        config_map = api.config_map(STATUS_NAMESPACE, STATUS_CONFIGMAP)
    except KubeAPIError:  # no autoscaler status (another autoscaler, or none yet)
        config_map = None
    return diagnose(pods, api.events(namespace), config_map, market), len(pods)


def end_run(api: KubeAPI, namespace: str, rayjob: str, cause: Cause) -> None:
    """Fail the RayJob now: a deadline of 1 s (KubeRay marks it Failed, DeadlineExceeded, and
    with shutdownAfterJobFinishes deletes its cluster after the TTL; rayjob_controller.go
    checkActiveDeadlineAndUpdateStatusIfNeeded, also while Initializing), a one-minute TTL, the
    cause in an annotation. KubeRay's optional webhook re-checks only the spec rules on update
    (pkg/webhooks/v1/rayjob_webhook.go ValidateUpdate); a RayJob never reruns on a spec change."""
    api.merge_patch(api.rayjob_path(namespace, rayjob), {
        "metadata": {"annotations": {CAUSE_ANNOTATION: f"{cause.summary}; fix: {cause.fix}"}},
        "spec": {"activeDeadlineSeconds": 1, "ttlSecondsAfterFinished": 60}})


def watch(api: KubeAPI, namespace: str, cluster: str, rayjob: str | None, end: bool,
          poll_s: float = POLL_S, say: Callable[[str], None] = print,
          sleep: Callable[[float], None] | None = None, market: Market = Market(),
          after_join: bool = False) -> str:
    """Poll until the workers are all scheduled ("joined"; with `after_join` it goes on, for
    workers that are Pending again) or the run is ended ("ended"), printing each new cause. A
    definite cause ends the run once two polls in a row found it (not one event read
    mid-update). An unreadable API is reported and retried."""
    said, seen = None, 0
    while True:
        try:
            cause, count = read_cause(api, namespace, cluster, market)
        except KubeAPIError as e:
            cause, count = Cause(f"cannot read the Kubernetes API ({e})", "check the head's "
                                 "service account and its Role (workloads/rbac.py)", False), -1
        line = cause.line() if cause is not None else JOINED if count > 0 else None
        seen = seen + 1 if line == said else 1
        if line is not None and line != said:
            say(line)
        said = line
        if line == JOINED and not after_join:
            return "joined"
        if cause is not None and cause.definite and end and rayjob and seen >= 2:
            try:
                end_run(api, namespace, rayjob, cause)
            except KubeAPIError as e:
                say(f"scale-up: could not end RayJob {rayjob} ({e}); it ends at its "
                    "preRunningDeadlineSeconds or activeDeadlineSeconds")
                return "not ended"
            say(f"scale-up: ended RayJob {rayjob}; its Ray cluster, and any GPU node that did "
                "launch, go within minutes")
            return "ended"
        (sleep or time.sleep)(poll_s)


JOINED = "scale-up: every worker pod has a node"


def cause_here(env: Mapping[str, str] = os.environ) -> Cause | None:
    """The cause for this run's pending workers, read from inside its Ray head; None off
    Kubernetes, when no worker is pending, or when the API cannot be read (it only informs)."""
    api, cluster = KubeAPI.in_cluster(env), env.get(CLUSTER_ENV)
    if api is None or not cluster:
        return None
    try:
        return read_cause(api, env.get(NAMESPACE_ENV, "default"), cluster,
                          Market.from_env(env))[0]
    except KubeAPIError:
        return None


def main(argv: list[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.head.scaleup", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--end-on-scaleup-failure", action=argparse.BooleanOptionalAction,
                    default=True, help="fail the RayJob when the cause is definite (default: on)")
    ap.add_argument("--poll-s", type=float, default=POLL_S)
    ap.add_argument("--stay", action="store_true", help="keep running afterwards (a container "
                    "of the head pod must, or the pod stops being Ready)")
    args = ap.parse_args(argv)
    # PID 1 of its container: without a handler SIGTERM is ignored and deletion waits 30 s.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    api, cluster = KubeAPI.in_cluster(env), env.get(CLUSTER_ENV)
    if api is None or not cluster:
        print("WARNING: scale-up watch: no Kubernetes API or RAY_CLUSTER_NAME here; not watching",
              file=sys.stderr, flush=True)
    else:
        try:  # for the whole run: a worker that loses its (spot) node needs another one
            watch(api, env.get(NAMESPACE_ENV, "default"), cluster, env.get(RAYJOB_ENV),
                  args.end_on_scaleup_failure, args.poll_s, say=lambda s: print(s, flush=True),
                  market=Market.from_env(env), after_join=True)
        except Exception as e:  # a crashing container would keep the head pod unready
            print(f"WARNING: scale-up watch stopped: {type(e).__name__}: {e}", file=sys.stderr,
                  flush=True)
    while args.stay:
        time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
