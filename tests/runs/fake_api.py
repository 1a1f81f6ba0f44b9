"""A Kubernetes API server on loopback for `python -m runs` and its `kubernetes` client: RayJobs
(ray.io/v1) created, read, listed and deleted, a run's ConfigMap, Role and RoleBinding created,
pods listed by label selector and their logs. It
answers like the API server where the client depends on it: bearer-token authentication (401),
201 with the stored object (uid, creationTimestamp) on create, 409 AlreadyExists, 404 Status
objects, equality label selectors, text/plain pod logs. Every request is recorded."""

from __future__ import annotations

import copy
import json
import re
import threading
from http.server import ThreadingHTTPServer
from urllib.parse import urlparse

from tests.training.kube_fake import TOKEN, handler, listed, status, ts

T0 = 1_796_112_000.0  # 2026-12-01T08:00:00Z
ROUTES = (
    (re.compile(r"^/apis/ray\.io/v1/namespaces/([^/]+)/(rayjobs)(?:/([^/]+))?$"), None),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/(pods|configmaps)(?:/([^/]+))?$"), None),
    (re.compile(r"^/apis/rbac\.authorization\.k8s\.io/v1/namespaces/([^/]+)/"
                r"(roles|rolebindings)(?:/([^/]+))?$"), None),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/(log)$"), "log"),
)


def submitter_pod(job: str, created: float) -> dict:
    """The submitter Job's pod as batch/v1 labels it (`batch.kubernetes.io/job-name`)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-x7k2p", "namespace": "ray", "uid": f"{job}-pod",
                         "creationTimestamp": ts(created),
                         "labels": {"batch.kubernetes.io/job-name": job}},
            "spec": {"containers": [{"name": "ray-job-submitter", "image": "ray"}]},
            "status": {"phase": "Running"}}


class FakeAPI:
    def __init__(self, rayjobs: list[dict] | None = None, pods: list[dict] | None = None,
                 logs: dict[str, str] | None = None):
        self.world = {"rayjobs": copy.deepcopy(rayjobs or []), "pods": copy.deepcopy(pods or []),
                      "roles": [], "rolebindings": [], "configmaps": []}
        self.logs = dict(logs or {})
        self.requests: list[tuple[str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def kubeconfig(self, token: str = TOKEN) -> dict:
        url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": url}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": token}}]}

    def __enter__(self) -> "FakeAPI":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def names(self) -> list[str]:
        return [j["metadata"]["name"] for j in self.world["rayjobs"]]

    def _answer(self, method: str, url: str, headers, body: bytes) -> tuple[int, object]:
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, status(401, "Unauthorized", "Unauthorized")
        parsed = urlparse(url)
        self.requests.append((method, parsed.path))
        for pattern, kind in ROUTES:
            if (m := pattern.match(parsed.path)):
                break
        else:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        if kind == "log":
            name = m[2]
            if name not in self.logs:
                return 404, status(404, "NotFound", f'pods "{name}" not found')
            return 200, self.logs[name]
        ns, resource, name = m.groups()
        objs = [o for o in self.world[resource] if o["metadata"].get("namespace") == ns]
        if method == "POST" and name is None:
            obj = json.loads(body)
            if any(o["metadata"]["name"] == obj["metadata"]["name"] for o in objs):
                return 409, status(409, "AlreadyExists",
                                    f'{resource}.ray.io "{obj["metadata"]["name"]}" already exists')
            obj["metadata"].update(namespace=ns, uid=f"uid-{len(self.world[resource])}",
                                   creationTimestamp=ts(T0 + len(self.world[resource])))
            self.world[resource].append(obj)
            return 201, obj
        if name is None:
            return 200, listed(objs, parsed.query)
        found = next((o for o in objs if o["metadata"]["name"] == name), None)
        if found is None:
            return 404, status(404, "NotFound", f'{resource}.ray.io "{name}" not found')
        if method == "DELETE":
            self.world[resource].remove(found)
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        return 200, found

    def _handler(self):
        return handler(self._answer, ("GET", "POST", "DELETE"))
