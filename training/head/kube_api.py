"""A tiny Kubernetes API client for the Ray head: plain HTTPS with the pod's service-account token
and CA. Standard library only: the Ray Train image's lockfile has no `kubernetes` package
(aws/deep-learning-containers `docker/ray-train/uv.lock`: `jsonschema-specifications` is followed
by `lightning-utilities`; PyYAML, which training/head/scaleup.py reads with, is there), and the head
needs a handful of GETs and one merge patch, not a client library.

In a pod, `KUBERNETES_SERVICE_HOST`/`_PORT` name the API server and the kubelet mounts the token
and CA under SA_DIR (Kubernetes docs, "Accessing the Kubernetes API from a Pod"). Elsewhere (a
laptop run) `in_cluster()` returns None and callers go on without the API.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT_S = 10.0


class KubeAPIError(RuntimeError):
    """The API could not be reached or refused the request; the message says which and why."""


@dataclass(frozen=True)
class KubeAPI:
    base_url: str  # https://host:port (or http://127.0.0.1:port in tests)
    token_file: Path | None = None  # read per request: kubelet rotates bound tokens in place
    ca_file: Path | None = None
    timeout_s: float = TIMEOUT_S

    @classmethod
    def in_cluster(cls, env: Mapping[str, str] = os.environ,
                   sa_dir: Path | None = None) -> "KubeAPI | None":
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        sa_dir = sa_dir or SA_DIR
        token = sa_dir / "token"
        if not host or not port or not token.exists():
            return None
        host = f"[{host}]" if ":" in host else host  # an IPv6 service address
        ca = sa_dir / "ca.crt"
        return cls(f"https://{host}:{port}", token, ca if ca.exists() else None)

    def _context(self) -> ssl.SSLContext | None:
        if not self.base_url.startswith("https:"):
            return None
        return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)

    def _request(self, method: str, path: str, params: Mapping[str, str] | None,
                 body: dict | None, content_type: str = "application/json") -> dict:
        url = self.base_url + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        headers = {"Accept": "application/json"}
        if self.token_file is not None:
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), content_type
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s,
                                        context=self._context()) as resp:
                return json.loads(resp.read().decode() or "{}")
        except urllib.error.HTTPError as e:
            raise KubeAPIError(f"{method} {path}: HTTP {e.code} {_status_message(e)}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise KubeAPIError(f"{method} {path}: {getattr(e, 'reason', e)}") from None

    def get(self, path: str, **params: str) -> dict:
        return self._request("GET", path, params, None)

    def merge_patch(self, path: str, body: dict) -> dict:
        return self._request("PATCH", path, None, body, "application/merge-patch+json")

    # The objects the head reads, by their REST paths (API reference, core/v1 and ray.io/v1).
    def pods(self, namespace: str, label_selector: str) -> list[dict]:
        return self.get(f"/api/v1/namespaces/{namespace}/pods",
                        labelSelector=label_selector).get("items", [])

    def events(self, namespace: str) -> list[dict]:
        return self.get(f"/api/v1/namespaces/{namespace}/events").get("items", [])

    def node(self, name: str) -> dict:
        return self.get(f"/api/v1/nodes/{name}")

    def config_map(self, namespace: str, name: str) -> dict:
        return self.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")

    def rayjob_path(self, namespace: str, name: str) -> str:
        return f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}"


def _status_message(e: urllib.error.HTTPError) -> str:
    """The API server's Status message (e.g. `pods is forbidden: User ... cannot list ...`)."""
    try:
        return json.loads(e.read().decode()).get("message", e.reason)
    except (ValueError, OSError):
        return str(e.reason)
