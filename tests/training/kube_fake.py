"""A Kubernetes API server on loopback for the head's client (training/head/kube_api.py) and for
the Pulumi program's read of an existing cluster (infra/existing_kueue.py), and the objects a
run's cold start leaves there, written from the API reference (core/v1 Pod, Node, Event,
ConfigMap; ray.io/v1 RayJob; apiextensions.k8s.io/v1 CustomResourceDefinition), never recorded
from a cluster.

It answers like the API server where the client depends on it: bearer-token authentication
(401), RBAC authorization of every request against the Roles the stack deploys
(workloads/rbac.py: 403 with the server's message), equality label selectors, 404 Status
objects, and JSON merge patch (RFC 7386) only with its content type (415 otherwise). Every
request is recorded with the RBAC verb it needed.
"""

from __future__ import annotations

import copy
import json
import re
import ssl
import subprocess
import threading
import zlib
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

TOKEN = "test-token"
SA = "system:serviceaccount:ray:ray-train"


def ts(t: float) -> str:
    """An API timestamp (RFC 3339, whole seconds, as metav1.Time serializes)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- objects ------------------------------------------------------------------------------

def rayjob(name: str, created: float) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": "ray", "uid": "job-uid",
                         "creationTimestamp": ts(created), "annotations": {}},
            "spec": {"entrypoint": "python -m training", "shutdownAfterJobFinishes": True,
                     "ttlSecondsAfterFinished": 300, "activeDeadlineSeconds": 14400},
            "status": {"jobDeploymentStatus": "Initializing"}}


def pod(name: str, cluster: str, created: float, node: str | None = None,
        scheduled: float | None = None, ready: float | None = None,
        node_type: str = "worker") -> dict:
    """A Ray pod as KubeRay labels it (common/pod.go labelPod) with the status the kubelet and
    scheduler write: Pending without a node, Running with PodScheduled and Ready."""
    conditions = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                           "lastTransitionTime": ts(scheduled)})
    else:
        conditions.append({"type": "PodScheduled", "status": "False", "lastProbeTime": None,
                           "lastTransitionTime": ts(created), "reason": "Unschedulable",
                           "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."})
    if ready is not None:
        conditions += [{"type": t, "status": "True", "lastProbeTime": None,
                        "lastTransitionTime": ts(ready)}
                       for t in ("Initialized", "ContainersReady", "Ready")]
    spec = {"containers": [{"name": "ray-worker", "image": IMAGE}],
            "serviceAccountName": "ray-train"}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ray", "uid": f"uid-{name}",
                         "creationTimestamp": ts(created),
                         "labels": {"ray.io/cluster": cluster, "ray.io/node-type": node_type,
                                    "ray.io/group": "gpu" if node_type == "worker" else "headgroup",
                                    "ray.io/is-ray-node": "yes"}},
            "spec": spec,
            "status": {"phase": "Running" if ready else "Pending", "conditions": conditions,
                       "qosClass": "Guaranteed"}}


def node(name: str, created: float, ready: float) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": ts(created),
                         "labels": {"node.kubernetes.io/instance-type": "g6.12xlarge",
                                    "role": "gpu-worker"}},
            "spec": {"providerID": f"aws:///us-west-2a/i-0{zlib.crc32(name.encode()):016x}"},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False",
                 "reason": "KubeletHasSufficientMemory",
                 "lastHeartbeatTime": ts(ready), "lastTransitionTime": ts(created)},
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "lastHeartbeatTime": ts(ready), "lastTransitionTime": ts(ready)}]}}



def failing(node_obj: dict, condition: str, reason: str, message: str, since: float) -> dict:
    """`node_obj` with a monitoring-agent condition False, as the agent's exporter sets it
    (aws/eks-node-monitoring-agent pkg/manager/node_exporter.go Fatal: Status False, the
    monitor's Reason and Message; e.g. monitors/nvidia/dcgm/dcgm_policies.go handleXidFinding:
    NvidiaXID79Error, "detected XID-79 on the instance, review kernel logs for additional
    information.")."""
    sick = copy.deepcopy(node_obj)
    sick["status"]["conditions"].append(
        {"type": condition, "status": "False", "reason": reason, "message": message,
         "lastHeartbeatTime": ts(since), "lastTransitionTime": ts(since)})
    return sick


def xid_node(name: str, since: float, xid: int = 79) -> dict:
    """A Ready GPU node whose GPU fell off the bus (a well-known XID: Replace)."""
    return failing(node(name, since - 3600, since - 3500), "AcceleratedHardwareReady",
                   f"NvidiaXID{xid}Error", f"detected XID-{xid} on the instance, review kernel "
                   "logs for additional information.", since)

def event(obj: dict, reason: str, message: str, first: float, last: float | None = None,
          component: str = "kubelet", kind: str = "Normal", count: int = 1) -> dict:
    """A core/v1 Event as client-go's recorder writes it (tools/record)."""
    meta = obj["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{zlib.crc32(f'{reason}{first}'.encode()):x}",
                         "namespace": meta.get("namespace", "default"),
                         "creationTimestamp": ts(first)},
            "involvedObject": {"kind": obj["kind"], "namespace": meta.get("namespace"),
                               "name": meta["name"], "uid": meta["uid"],
                               "apiVersion": obj["apiVersion"]},
            "reason": reason, "message": message, "type": kind, "count": count,
            "source": {"component": component},
            "firstTimestamp": ts(first), "lastTimestamp": ts(last if last is not None else first),
            "eventTime": None, "reportingComponent": component}


IMAGE = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
GROUP = "eks-gpu-2026120108-5ec9a2b1-0c4d-7e3f-91a2-3b5d6e7f8a9b"


def autoscaler_status(groups: list[dict]) -> dict:
    """kube-system/cluster-autoscaler-status as cluster-autoscaler 1.35 writes it
    (clusterstate/utils/status.go WriteStatusConfigMap: YAML of clusterstate/api/types.go)."""
    lines = ["time: 2026-12-01 08:05:00.123456789 +0000 UTC", "autoscalerStatus: Running",
             "clusterWide:", "  health:", "    status: Healthy", "  scaleUp:",
             "    status: InProgress", "nodeGroups:"]
    for g in groups:
        lines += [f"- name: {g['name']}", "  health:", "    status: Healthy",
                  "    cloudProviderTarget: 0", "    minSize: 0", f"    maxSize: {g.get('max', 2)}",
                  "  scaleUp:", f"    status: {g['scale_up']}"]
        if g.get("code"):
            lines += ["    backoffInfo:", f"      errorCode: {g['code']}",
                      f"      errorMessage: {g['message']}"]
        lines += ["  scaleDown:", "    status: NoCandidates"]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system",
                         "uid": "cm-uid", "annotations": {
                             "cluster-autoscaler.kubernetes.io/last-updated":
                             "2026-12-01 08:05:00.123456789 +0000 UTC"}},
            "data": {"status": "\n".join(lines) + "\n"}}


def cold_start_world(t0: float, cluster: str = "ray-train-dev-f44c3b4189-x7k2p",
                     rayjob_name: str = "ray-train-dev-f44c3b4189") -> dict:
    """A healthy scale-from-zero start of 2 GPU workers, times relative to the RayJob's creation
    at t0: the autoscaler scales up at +14 s, nodes register at +95/+101 s and are Ready at
    +130/+140 s, the image pulls for 232.7 s and 240.1 s, the pods are Ready at +400/+410 s."""
    head = pod(f"{cluster}-head-abcde", cluster, t0 + 2, "ip-10-0-1-10", t0 + 2, t0 + 30, "head")
    w0 = pod(f"{cluster}-gpu-worker-aaaaa", cluster, t0 + 3, "ip-10-0-2-20", t0 + 150, t0 + 400)
    w1 = pod(f"{cluster}-gpu-worker-bbbbb", cluster, t0 + 3, "ip-10-0-2-21", t0 + 158, t0 + 410)
    n0, n1 = node("ip-10-0-2-20", t0 + 95, t0 + 130), node("ip-10-0-2-21", t0 + 101, t0 + 140)
    events = []
    for w, sched, pulled, took in ((w0, 150, 383, "3m52.7s"), (w1, 158, 398, "4m0.1s")):
        events += [
            event(w, "FailedScheduling", "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. "
                  "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming "
                  "pod.", t0 + 3, t0 + 120, "default-scheduler", "Warning", 5),
            event(w, "TriggeredScaleUp", f"pod triggered scale-up: [{{{GROUP} 0->2 (max: 2)}}]",
                  t0 + 14, component="cluster-autoscaler"),
            event(w, "Scheduled", f"Successfully assigned ray/{w['metadata']['name']} to "
                  f"{w['spec']['nodeName']}", t0 + sched, component="default-scheduler"),
            event(w, "Pulling", f'Pulling image "{IMAGE}"', t0 + sched + 2),
            event(w, "Pulled", f'Successfully pulled image "{IMAGE}" in {took} ({took} including '
                  'waiting). Image size: 17283459072 bytes.', t0 + pulled),
            event(w, "Created", "Created container: ray-worker", t0 + pulled + 1),
            event(w, "Started", "Started container ray-worker", t0 + pulled + 2)]
    events.append(event(head, "Pulled", f'Container image "{IMAGE}" already present on machine',
                        t0 + 5))
    return {"rayjobs": [rayjob(rayjob_name, t0)], "pods": [head, w0, w1], "nodes": [n0, n1],
            "events": events, "configmaps": [autoscaler_status([{"name": GROUP,
                                                                 "scale_up": "NoActivity"}])]}


# --- the server ---------------------------------------------------------------------------

ROUTES = [  # path -> (API group, resource, namespace group, name group)
    (re.compile(r"^/api/v1/namespaces/([^/]+)/(pods|events|configmaps)(?:/([^/]+))?$"), ""),
    (re.compile(r"^/api/v1/(nodes)(?:/([^/]+))?$"), ""),
    (re.compile(r"^/apis/ray.io/v1/namespaces/([^/]+)/(rayjobs)(?:/([^/]+))?$"), "ray.io"),
    (re.compile(r"^/apis/apiextensions.k8s.io/v1/(customresourcedefinitions)(?:/([^/]+))?$"),
     "apiextensions.k8s.io"),
]


def _attributes(method: str, path: str) -> tuple[str, str, str, str | None, str | None] | None:
    """(verb, group, resource, namespace, name) as the API server's request info resolves them."""
    for pattern, group in ROUTES:
        if (m := pattern.match(path)):
            parts = m.groups()
            ns, resource, name = (None, *parts) if len(parts) == 2 else parts
            verb = {"GET": "get" if name else "list", "PATCH": "patch"}.get(method, method.lower())
            return verb, group, resource, ns, name
    return None


def allowed(rbac: list[dict], verb: str, group: str, resource: str, ns: str | None,
            name: str | None) -> bool:
    """Kubernetes RBAC: a Role's rules apply in its namespace, a ClusterRole's everywhere; every
    object given is bound to the service account (workloads/rbac.py binds each one)."""
    for role in (r for r in rbac if r["kind"] in ("Role", "ClusterRole")):
        if role["kind"] == "Role" and role["metadata"]["namespace"] != ns:
            continue
        for rule in role["rules"]:
            if group in rule["apiGroups"] and resource in rule["resources"] \
                    and verb in rule["verbs"] \
                    and ("resourceNames" not in rule or name in rule["resourceNames"]):
                return True
    return False


class FakeKube:
    def __init__(self, world: dict, rbac: list[dict] | None, tls_dir: Path | None = None,
                 user: str = SA):
        """`rbac`: the Roles bound to `user`, the identity of every request; None: no RBAC."""
        self.world, self.rbac, self.user = copy.deepcopy(world), rbac, user
        self.requests: list[tuple[str, str, str, str | None, str | None]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.ca_file = None
        if tls_dir is not None:
            self.ca_file = self._tls(tls_dir)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _tls(self, d: Path) -> Path:
        cert, key = d / "ca.crt", d / "server.key"
        if not cert.exists():  # a self-signed certificate for 127.0.0.1, as the cluster CA
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                            "-keyout", str(key), "-out", str(cert)], check=True,
                           capture_output=True)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        return cert

    @property
    def url(self) -> str:
        scheme = "https" if self.ca_file else "http"
        return f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def __enter__(self) -> "FakeKube":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def object(self, resource: str, name: str) -> dict:
        return next(o for o in self.world[resource] if o["metadata"]["name"] == name)

    def _answer(self, method: str, url: str, headers, body: bytes) -> tuple[int, dict]:
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, status(401, "Unauthorized", "Unauthorized")
        parsed = urlparse(url)
        attrs = _attributes(method, parsed.path)
        if attrs is None:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        verb, group, resource, ns, name = attrs
        self.requests.append(attrs)
        if self.rbac is not None and not allowed(self.rbac, verb, group, resource, ns, name):
            where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
            return 403, status(403, "Forbidden", f'{resource} "{name or ""}" is forbidden: User '
                                f'"{self.user}" cannot {verb} resource "{resource}" in API group '
                                f'"{group}"{where}')
        objs = [o for o in self.world.get(resource, [])
                if ns is None or o["metadata"].get("namespace") == ns]
        if name is None:
            return 200, listed(objs, parsed.query)
        found = next((o for o in objs if o["metadata"]["name"] == name), None)
        if found is None:  # the API server names the resource with its group (NewNotFound)
            qualified = f"{resource}.{group}" if group else resource
            return 404, status(404, "NotFound", f'{qualified} "{name}" not found')
        if method == "PATCH":
            if headers.get("Content-Type") != "application/merge-patch+json":
                return 415, status(415, "UnsupportedMediaType", "the body of the request was "
                                    "in an unknown format")
            _merge(found, json.loads(body))
        return 200, found

    def _handler(self):
        return handler(self._answer, ("GET", "PATCH"))


def handler(answer, verbs: tuple[str, ...]) -> type[BaseHTTPRequestHandler]:
    """The HTTP side of a fake API server: `answer(method, path, headers, body)` -> (status,
    payload); a str payload goes out as text/plain (pod logs), anything else as JSON."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            code, payload = answer(self.command, self.path, self.headers, body)
            text = isinstance(payload, str)
            data = (payload if text else json.dumps(payload)).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    for verb in verbs:
        setattr(Handler, f"do_{verb}", Handler._serve)
    return Handler


def listed(objs: list[dict], query: str) -> dict:
    """A List of the objects that match the query's labelSelector (equality terms only, as the
    job's and the CLI's selectors are)."""
    selector = parse_qs(query).get("labelSelector", [""])[0]
    wanted = dict(kv.split("=", 1) for kv in selector.split(",") if kv)
    items = [o for o in objs if all(o["metadata"].get("labels", {}).get(k) == v
                                    for k, v in wanted.items())]
    return {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}


def status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _merge(target: dict, patch: dict) -> None:
    """RFC 7386: objects merge, null deletes, anything else replaces."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = v


def in_cluster_env(fake: FakeKube, tmp_path: Path, cluster: str, rayjob_name: str | None,
                   price: str | None = "4.6016") -> tuple[dict, Path]:
    """The environment and service-account directory a Ray head container has (kubelet and
    KubeRay set these), pointing at `fake`."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text(TOKEN + "\n")
    if fake.ca_file:
        (sa / "ca.crt").write_text(fake.ca_file.read_text())
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(fake.port),
           "RAY_CLUSTER_NAME": cluster, "RAY_CLUSTER_NAMESPACE": "ray"}
    if rayjob_name:
        env["RAYJOB_NAME"] = rayjob_name
    if price:
        env["GPU_NODE_USD_PER_HOUR"] = price
    return env, sa
