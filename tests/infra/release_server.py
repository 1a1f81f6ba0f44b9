"""A loopback stand-in for the host of KubeRay's release files (raw.githubusercontent.com), so
the program's own fetch of the CRDs runs offline: `/v<version>/ray.io_<plural>.yaml` serves the
release's file from ../shared where it is there, otherwise a minimal CRD of that kind generated
here; `/status/<code>/...` answers that HTTP status, as the host does when it rate-limits (429)
or lacks a file (404)."""

from __future__ import annotations

import functools
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from stack.catalog import KUBERAY_CRD_KINDS
from tests.conftest import KUBERAY_CRDS

_CRD_PATH = re.compile(r"^/v[\d.]+/ray\.io_(?P<plural>[a-z]+)\.yaml$")
_STATUS_PATH = re.compile(r"^/status/(?P<code>\d{3})/")


def stand_in_crd(plural: str) -> str:
    """A CRD of `plural` (e.g. rayservices) with no schema, for files ../shared lacks."""
    kind = {f"{k.lower()}s": k for k in KUBERAY_CRD_KINDS}[plural]
    return yaml.safe_dump({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.ray.io"},
        "spec": {"group": "ray.io", "scope": "Namespaced",
                 "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                           "listKind": f"{kind}List"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                     "openAPIV3Schema": {"type": "object",
                                         "x-kubernetes-preserve-unknown-fields": True}}}]}})


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        status = _STATUS_PATH.match(self.path)
        crd = _CRD_PATH.match(self.path)
        if status:
            self._send(int(status["code"]), "<html>not a CRD</html>", "text/html")
        elif crd:
            path = KUBERAY_CRDS / f"ray.io_{crd['plural']}.yaml"
            self._send(200, path.read_text() if path.exists() else stand_in_crd(crd["plural"]),
                       "text/plain")
        else:
            self._send(404, "404: Not Found", "text/plain")

    def _send(self, code: int, body: str, content_type: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@functools.cache
def base_url() -> str:
    """http://127.0.0.1:<port>, the server running for the rest of the test session."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def crd_url(prefix: str = "") -> str:
    """A KUBERAY_CRD_URL template pointing at the server (`prefix` e.g. "/status/404")."""
    return base_url() + prefix + "/v{version}/ray.io_{plural}.yaml"
