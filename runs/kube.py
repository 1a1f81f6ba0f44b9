"""The Kubernetes API as `python -m runs` uses it, through the official `kubernetes` client with
the stack's kubeconfig (the `kubeconfig` output: an exec credential from `aws eks get-token`).
Every failure becomes one RunsError line: no cluster (the endpoint cannot be reached), no
credentials (the exec plugin fails, or the API answers 401/403), an unknown run (404).

Two habits of the client would add noise: its kubeconfig loader runs the exec plugin itself and
only `logging.error`s a failure, then sends the request without a token
(kubernetes/config/kube_config.py `_load_from_exec_plugin`); and it builds its urllib3 pool,
with urllib3's default of 3 retries (one warning each), when the ApiClient is made
(client/rest.py reads `configuration.retries` there, so setting it afterwards does nothing).
So the exec credential is fetched here first, with the client's own ExecProvider, and the
retries are set on the Configuration before the ApiClient exists."""

from __future__ import annotations

import re
from typing import Iterator

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.exec_provider import ExecProvider
from kubernetes.config.kube_config import ConfigNode

from runs.errors import RunsError

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
# The submitter Job's pods: batch/v1 labels them with their Job's name, and KubeRay names the
# submitter Job after the RayJob (common/job.go, K8sJobMode).
SUBMITTER_SELECTOR = "batch.kubernetes.io/job-name={name}"


def _failed(e: Exception, what: str) -> RunsError:
    if isinstance(e, ApiException):
        if e.status in (401, 403):
            return RunsError(f"{what}: the API refused the credentials (HTTP {e.status}); check "
                             f"`aws sts get-caller-identity` and the cluster's access entries")
        return RunsError(f"{what}: HTTP {e.status} {e.reason}")
    if isinstance(e, ConfigException):
        return RunsError(f"{what}: no credentials for the cluster ({e})")
    return RunsError(f"{what}: cannot reach the cluster's API ({type(e).__name__}); is the "
                     f"stack deployed and the endpoint reachable from here?")


def with_token(kubeconfig: dict) -> dict:
    """`kubeconfig` with its current user's exec credential (`aws eks get-token`) run once here
    and replaced by the token it printed. Raises RunsError naming the command and its last
    error line (no AWS credentials, no such profile, no `aws` on PATH)."""
    contexts = {c.get("name"): c.get("context", {}) for c in kubeconfig.get("contexts") or []}
    user_name = contexts.get(kubeconfig.get("current-context"), {}).get("user")
    users = kubeconfig.get("users") or []
    entry = next((u for u in users if u.get("name") == user_name), None)
    spec = (entry or {}).get("user") or {}
    if "exec" not in spec:
        return kubeconfig
    command = " ".join([spec["exec"].get("command", ""), *spec["exec"].get("args", [])])
    try:
        status = ExecProvider(ConfigNode("exec", spec["exec"]), None).run()
    except (ConfigException, OSError) as e:
        # ExecProvider.run: "exec: process returned <status>. <the plugin's stderr>"
        text = re.sub(r"^exec: process returned (\d+)\.?\s*", r"exit status \1: ", str(e).strip())
        last = (text.splitlines() or [type(e).__name__])[-1]
        raise RunsError(f"no credentials for the cluster: `{command}` failed ({last}); "
                        "check `aws sts get-caller-identity`") from None
    if "token" not in status:
        raise RunsError(f"no credentials for the cluster: `{command}` printed no token")
    token_user = {"name": user_name, "user": {"token": status["token"]}}
    return {**kubeconfig, "users": [token_user if u is entry else u for u in users]}


class Kube:
    """The calls the CLI makes, in the stack's Ray namespace."""

    def __init__(self, kubeconfig: dict, namespace: str):
        self.namespace = namespace
        conf = client.Configuration()
        conf.retries = 0  # one attempt, no urllib3 retry warnings: an absent cluster fails at once
        try:
            api = config.new_client_from_config_dict(with_token(kubeconfig),
                                                     client_configuration=conf)
        except (ConfigException, KeyError, TypeError, AttributeError) as e:
            raise RunsError(f"kubeconfig: cannot use it ({e})") from None
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs, _request_timeout=30)
        except ApiException as e:
            if e.status == 404:
                raise RunsError(f"{what}: not found") from None
            if e.status == 409:
                raise RunsError(f"{what}: already exists (cancel it first, or --name)") from None
            raise _failed(e, what) from None
        except (ConfigException, urllib3.exceptions.HTTPError, OSError) as e:
            raise _failed(e, what) from None

    def create(self, job: dict) -> dict:
        name = job["metadata"]["name"]
        return self._call(f"run {name}", self.custom.create_namespaced_custom_object,
                          GROUP, VERSION, self.namespace, PLURAL, job)

    def create_configmap(self, obj: dict) -> None:
        self._call(f"ConfigMap {obj['metadata']['name']}",
                   self.core.create_namespaced_config_map, self.namespace, obj)

    def grant(self, objs: list[dict]) -> None:
        """Create a run's Role and RoleBinding (workloads.rbac.run_rbac)."""
        create = {"Role": self.rbac.create_namespaced_role,
                  "RoleBinding": self.rbac.create_namespaced_role_binding}
        for obj in objs:
            self._call(f"{obj['kind']} {obj['metadata']['name']}", create[obj["kind"]],
                       self.namespace, obj)

    def rayjobs(self) -> list[dict]:
        return self._call("list runs", self.custom.list_namespaced_custom_object,
                          GROUP, VERSION, self.namespace, PLURAL)["items"]

    def rayjob(self, name: str) -> dict:
        return self._call(f"run {name}", self.custom.get_namespaced_custom_object,
                          GROUP, VERSION, self.namespace, PLURAL, name)

    def delete(self, name: str) -> None:
        """Foreground: its RayCluster and submitter Job go with it (KubeRay owns them)."""
        self._call(f"run {name}", self.custom.delete_namespaced_custom_object,
                   GROUP, VERSION, self.namespace, PLURAL, name,
                   body={"propagationPolicy": "Foreground"})

    def submitter_pod(self, name: str) -> str | None:
        """The newest pod of the run's submitter Job (a retry makes another), or None."""
        pods = self._call(f"run {name}", self.core.list_namespaced_pod, self.namespace,
                          label_selector=SUBMITTER_SELECTOR.format(name=name)).items
        pods.sort(key=lambda p: p.metadata.creation_timestamp)
        return pods[-1].metadata.name if pods else None

    def log(self, pod: str) -> str:
        """The raw body: the client's own decoding of a text/plain answer yields the repr of
        its bytes (`"b'...'"`) in kubernetes 36, so the response is read undecoded."""
        response = self._call(f"pod {pod}", self.core.read_namespaced_pod_log, pod,
                              self.namespace, _preload_content=False)
        return response.data.decode(errors="replace")

    def follow(self, pod: str) -> Iterator[str]:
        """The pod's log lines as they come, until the container ends."""
        try:
            stream = self.core.read_namespaced_pod_log(pod, self.namespace, follow=True,
                                                       _preload_content=False)
            for line in stream.stream():
                yield line.decode(errors="replace")
        except ApiException as e:
            raise _failed(e, f"pod {pod}") from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise _failed(e, f"pod {pod}") from None
