"""Where a run's first minutes go: the phases from the RayJob's creation to the first optimizer
step, each with its seconds and the GPU-node dollars it cost.

The Kubernetes side (worker pods, their GPU nodes, kubelet's image-pull events) is read by the
Ray head from the API (`observe`, once the workers have joined: events live about an hour); the
job side (workers joined, NCCL up, model and data ready, first step) comes from the job's own
clock (the driver's, and `cold_start_marks` of the loop's rank 0). `timeline` joins them.
Standard library only: the Pulumi program imports the environment names below.

Sources: Pod `status.conditions` (PodScheduled, Ready) and Node `metadata.creationTimestamp` and
its Ready condition (API reference, core/v1); kubelet's `Pulling`/`Pulled` events, "Successfully
pulled image %q in %v (%v including waiting). Image size: %v bytes." or "Container image %q
already present on machine" (kubernetes `pkg/kubelet/images/image_manager.go`); the autoscaler's
`TriggeredScaleUp` pod event (cluster-autoscaler
`processors/status/eventing_scale_up_processor.go`).
Events are read as core/v1 Events, the API both writers use (client-go `tools/record`), which
keeps their `count` and `firstTimestamp`/`lastTimestamp` as written and can be listed per
namespace with one read-only call.
"""

from __future__ import annotations

import os
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Mapping

from training.head.kube_api import KubeAPI, KubeAPIError

# Set on the Ray head by workloads/raycluster.py and workloads/rayjob.py.
RAYJOB_ENV = "RAYJOB_NAME"
PRICE_ENV = "GPU_NODE_USD_PER_HOUR"  # the GPU instance's on-demand price (stack/catalog.py)
# Set by KubeRay in every Ray container (common/pod.go setContainerEnvVars).
CLUSTER_ENV, NAMESPACE_ENV = "RAY_CLUSTER_NAME", "RAY_CLUSTER_NAMESPACE"
WORKER_SELECTOR = "ray.io/cluster={cluster},ray.io/node-type=worker"

# (milestone key, phase name: what the time up to that milestone went on), in run order.
PHASES = (
    ("pods_created", "RayJob to Ray cluster pods created"),
    ("scale_up_triggered", "worker pods pending until cluster-autoscaler scales up"),
    ("nodes_registered", "GPU nodes launching (EC2 start, boot, kubelet joins)"),
    ("nodes_ready", "GPU nodes becoming Ready"),
    ("pods_scheduled", "worker pods scheduled (device plugins advertise GPUs and EFA)"),
    ("image_pulled", "image pull"),
    ("pods_ready", "worker containers start, Ray workers Ready"),
    ("job_started", "RayJob submits the job"),
    ("workers_joined", "Ray workers join the job's cluster"),
    ("train_started", "Ray Train starts its workers"),
    ("nccl_ready", "NCCL initialised"),
    ("model_ready", "model and data ready"),
    ("first_step", "first optimizer step"),
)


def parse_time(text: str | None) -> float | None:
    """An API timestamp (RFC 3339, `Z` or an offset, optional fraction) as epoch seconds."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def go_seconds(text: str) -> float:
    """A Go `time.Duration` string (`2m13.5s`, `313ms`, `1h2m3s`) in seconds."""
    parts = re.findall(r"([0-9.]+)(ms|us|µs|ns|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


PULLED = re.compile(r'Successfully pulled image "[^"]*" in (\S+?)(?: \((\S+) including waiting\))?'
                    r'(?:\. Image size: (\d+) bytes)?\.?$')


def _condition(obj: dict, kind: str) -> float | None:
    """When a True condition of this type last changed."""
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c.get("type") == kind and c.get("status") == "True":
            return parse_time(c.get("lastTransitionTime"))
    return None


def event_time(e: dict) -> float | None:
    """When a core/v1 Event first happened (`eventTime` for writers of the newer API)."""
    return parse_time(e.get("firstTimestamp") or e.get("eventTime")
                      or e.get("metadata", {}).get("creationTimestamp"))


DIGEST = re.compile(r"@?(sha256:[0-9a-f]{64})$")


def image_digest(pod: dict) -> str | None:
    """The digest of the image the pod's Ray container (KubeRay's container 0) ran:
    `status.containerStatuses[].imageID`, which the runtime resolves whatever the spec named
    (a tag moves with rebuilds; API reference core/v1 ContainerStatus: "The image ID may not
    match the image ID of the image used in the PodSpec, as it may have been resolved by the
    runtime"): containerd writes `repo@sha256:<hex>`, dockershim `docker-pullable://repo@sha256:`."""
    container = pod.get("spec", {}).get("containers", [{}])[0].get("name")
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if container in (None, status.get("name")) and (m := DIGEST.search(status.get("imageID", ""))):
            return m[1]
    return None


def _pod_view(pod: dict, events: list[dict], node: dict | None) -> dict:
    uid = pod["metadata"]["uid"]
    mine = sorted((e for e in events if e.get("involvedObject", {}).get("uid") == uid),
                  key=lambda e: event_time(e) or 0.0)
    view = {"name": pod["metadata"]["name"], "node": pod.get("spec", {}).get("nodeName"),
            "created": parse_time(pod["metadata"].get("creationTimestamp")),
            "scheduled": _condition(pod, "PodScheduled"), "ready": _condition(pod, "Ready"),
            "scale_up_triggered": None, "pulled": None, "pull_s": None, "image_bytes": None,
            "node_created": None, "node_ready": None, "image_digest": image_digest(pod)}
    for e in mine:
        reason, message = e.get("reason"), e.get("message", "")
        if reason == "TriggeredScaleUp" and view["scale_up_triggered"] is None:
            view["scale_up_triggered"] = event_time(e)
        elif reason == "Pulled" and view["pulled"] is None:
            view["pulled"] = parse_time(e.get("lastTimestamp")) or event_time(e)
            if (m := PULLED.search(message)):
                view["pull_s"] = go_seconds(m[1])
                view["image_bytes"] = int(m[3]) if m[3] else None
            elif "already present on machine" in message:
                view["pull_s"] = 0.0
    if node:
        view["node_created"] = parse_time(node["metadata"].get("creationTimestamp"))
        view["node_ready"] = _condition(node, "Ready")
    return view


def observe(api: KubeAPI, namespace: str, cluster: str, rayjob: str | None) -> dict:
    """What Kubernetes recorded of this run's start: the RayJob's creation and, per worker pod,
    its milestones and its node's. Raises KubeAPIError when the API cannot be read."""
    pods = api.pods(namespace, WORKER_SELECTOR.format(cluster=cluster))
    events = api.events(namespace)
    nodes = {}
    for name in {p.get("spec", {}).get("nodeName") for p in pods} - {None}:
        nodes[name] = api.node(name)
    created = admitted = None
    if rayjob:
        job = api.get(api.rayjob_path(namespace, rayjob))
        created = parse_time(job["metadata"].get("creationTimestamp"))
        # KubeRay 1.7.0 sets status.startTime again when Kueue unsuspends a queued RayJob
        # (rayjob_controller.go: Suspended -> New -> initRayJobStatusIfNeed): its admission.
        admitted = parse_time((job.get("status") or {}).get("startTime"))
    return {"rayjob_created": created, "rayjob_admitted": admitted,
            "pods": [_pod_view(p, events, nodes.get(p.get("spec", {}).get("nodeName")))
                     for p in pods]}


def observe_here(env: Mapping[str, str] = os.environ, sa_dir: Path | None = None) -> dict | None:
    """`observe` for this run, from inside its Ray head; None where there is no Kubernetes API (a
    local run) and, with a warning, where it cannot be read: the run goes on without a timeline."""
    api, cluster = KubeAPI.in_cluster(env, sa_dir), env.get(CLUSTER_ENV)
    if api is None or not cluster:
        return None
    try:
        return observe(api, env.get(NAMESPACE_ENV, "default"), cluster, env.get(RAYJOB_ENV))
    except KubeAPIError as e:
        print(f"WARNING: no cold-start timeline: cannot read the Kubernetes API ({e})",
              file=sys.stderr, flush=True)
        return None


def _latest(pods: list[dict], key: str) -> float | None:
    """The run waits for its last worker: a milestone is reached when every pod reached it."""
    values = [p[key] for p in pods]
    return max(values) if values and None not in values else None


def milestones(observed: dict | None, marks: Mapping[str, float | None]) -> dict[str, float]:
    """Every milestone that was recorded, epoch seconds."""
    pods = (observed or {}).get("pods", [])
    # The cold start counts from admission; the wait in the queue before it is queue_s.
    seen = observed or {}
    at = {"start": seen.get("rayjob_admitted") or seen.get("rayjob_created"),
          "pods_created": _latest(pods, "created"),
          "scale_up_triggered": _latest(pods, "scale_up_triggered"),
          "nodes_registered": _latest(pods, "node_created"),
          "nodes_ready": _latest(pods, "node_ready"),
          "pods_scheduled": _latest(pods, "scheduled"),
          "image_pulled": _latest(pods, "pulled"),
          "pods_ready": _latest(pods, "ready"), **marks}
    return {k: v for k, v in at.items() if v is not None}


def timeline(observed: dict | None, marks: Mapping[str, float | None],
             usd_per_hour: float | None) -> dict:
    """The phases, contiguous from the first recorded milestone to the last, each with seconds
    and the dollars of the GPU nodes that existed during it (billed, as a lower bound, from the
    node object's creation: EC2 bills from the instance's start, some seconds earlier)."""
    at = milestones(observed, marks)
    pods = (observed or {}).get("pods", [])
    node_starts = sorted({p["node"]: p["node_created"] for p in pods
                          if p["node"] and p["node_created"] is not None}.values())
    phases, prev = [], at.get("start")
    for key, name in PHASES:
        if key not in at:
            continue
        if prev is None:
            prev = at[key]
            continue
        end = max(at[key], prev)  # clocks of nodes and API server differ by a second or so
        phases.append({"phase": name, "seconds": round(end - prev, 1),
                       "usd": _node_usd(node_starts, prev, end, usd_per_hour)})
        prev = end
    pulls = [p["pull_s"] for p in pods if p["pull_s"] is not None]
    return {"phases": phases, "queue_s": queue_seconds(observed),
            "total_s": round(sum(p["seconds"] for p in phases), 1),
            "gpu_node_usd": (round(sum(p["usd"] for p in phases), 4)
                             if usd_per_hour is not None else None),
            "gpu_node_usd_per_hour": usd_per_hour,
            "image_pull_s": pulls or None,
            "image_bytes": next((p["image_bytes"] for p in pods if p["image_bytes"]), None),
            # Every worker's; more than one where a tag moved between their pulls.
            "image_digest": ",".join(sorted({p.get("image_digest") for p in pods} - {None})) or None,
            "from": "rayjob" if "start" in at else ("first milestone" if phases else None)}


def queue_seconds(observed: dict | None) -> float | None:
    """How long the RayJob waited in Kueue's queue: creation to admission (no GPU node, no Ray
    head meanwhile, so no part of the cold start)."""
    created = (observed or {}).get("rayjob_created")
    admitted = (observed or {}).get("rayjob_admitted")
    return round(max(0.0, admitted - created), 1) if created and admitted else None


def _node_usd(node_starts: list[float], start: float, end: float,
              usd_per_hour: float | None) -> float | None:
    if usd_per_hour is None:
        return None
    node_s = sum(max(0.0, end - max(start, s)) for s in node_starts)
    return round(node_s * usd_per_hour / 3600, 4)


def price_here(env: Mapping[str, str] = os.environ) -> float | None:
    raw = env.get(PRICE_ENV)
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def report_lines(t: dict, title: str = "cold start") -> list[str]:
    """The log's view of `timeline`: one line per phase, then the total."""
    if not t["phases"]:
        return []
    money = t["gpu_node_usd"] is not None
    since = "the RayJob's creation" if t["from"] == "rayjob" else "the first recorded milestone"
    out = [f"{title} (from {since}):"]
    if t.get("queue_s"):
        out[0] = f"{title} (from the RayJob's admission, after {t['queue_s']:.1f} s in the queue):"
    for p in t["phases"]:
        cost = f"  {p['usd']:.3f} USD" if money else ""
        out.append(f"  {p['seconds']:8.1f} s{cost}  {p['phase']}")
    cost = f", GPU nodes {t['gpu_node_usd']:.2f} USD" if money else " (no price given)"
    pulls = ", image pulls " + "/".join(f"{s:.0f}" for s in t["image_pull_s"]) + " s" \
        if t["image_pull_s"] else ""
    out.append(f"  {t['total_s']:8.1f} s to {t['phases'][-1]['phase']}{cost}{pulls}")
    return out


def summarize(observed: dict | None, marks: Mapping[str, float | None],
              env: Mapping[str, str] = os.environ, title: str = "cold start") -> dict | None:
    """The run's timeline, printed to the log; None without what Kubernetes recorded."""
    if observed is None:
        return None
    t = timeline(observed, marks, price_here(env))
    for line in report_lines(t, title):
        print(line, flush=True)
    return t
