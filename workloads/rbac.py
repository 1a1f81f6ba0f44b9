"""What the Ray head may read (and, for a run that cannot start, change) in the Kubernetes API:
pure builders of rbac.authorization.k8s.io/v1 objects, the least scope that works.

The head reads its run's worker pods (list by label selector) and the namespace's events (the
kubelet's image pulls, cluster-autoscaler's scale-up events: training/cold_start.py and
training/scaleup.py), gets the GPU nodes those pods run on (cluster-scoped, so a ClusterRole;
`get` by name only, no `list`), and gets one ConfigMap in kube-system, cluster-autoscaler's
status. On its own RayJob (by name) it may `get` (the creation time) and, when
endOnScaleUpFailure is on, `patch` (to end a run that cannot start). Nothing else, and no write
anywhere else. A `list` under resourceNames is allowed only for one object named by a
`metadata.name` field selector (Kubernetes RBAC docs, "Referring to resources"), so the pod and
event lists are namespace-wide: the `ray` namespace holds only this stack's Ray objects.

The subject is `ray-train`, the service account of every Ray pod, GPU workers included: Pod
Identity maps that one account to the bucket role (infra/storage.py), and the head needs the
bucket too. A head-only account would need a second association.
"""

from __future__ import annotations

from stack.kube import NAMESPACE, SERVICE_ACCOUNT
from training.scaleup import STATUS_CONFIGMAP, STATUS_NAMESPACE

RBAC = "rbac.authorization.k8s.io/v1"
ROLE = "ray-head-reader"
STATUS_ROLE = "ray-head-autoscaler-status"
NODE_ROLE = f"{NAMESPACE}-{SERVICE_ACCOUNT}-node-reader"  # cluster-scoped: name says whose


def _rule(group: str, resources: list[str], verbs: list[str],
          names: list[str] | None = None) -> dict:
    rule = {"apiGroups": [group], "resources": resources, "verbs": verbs}
    if names:
        rule["resourceNames"] = names
    return rule


def _binding(kind: str, name: str, namespace: str | None) -> dict:
    role_kind = "ClusterRole" if kind == "ClusterRoleBinding" else "Role"
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": RBAC, "kind": kind, "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                          "namespace": NAMESPACE}]}


def head_rbac(rayjob_name: str, end_on_scaleup_failure: bool) -> list[dict]:
    """Roles and bindings for the head's service account. `rayjob_name` may be a Pulumi Output
    (the name hashes the storage URI): the builder only places it."""
    verbs = ["get", "patch"] if end_on_scaleup_failure else ["get"]
    rules = [_rule("", ["pods"], ["list"]), _rule("", ["events"], ["list"]),
             _rule("ray.io", ["rayjobs"], verbs, [rayjob_name])]
    return [
        {"apiVersion": RBAC, "kind": "Role", "metadata": {"name": ROLE, "namespace": NAMESPACE},
         "rules": rules},
        _binding("RoleBinding", ROLE, NAMESPACE),
        {"apiVersion": RBAC, "kind": "Role",
         "metadata": {"name": STATUS_ROLE, "namespace": STATUS_NAMESPACE},
         "rules": [_rule("", ["configmaps"], ["get"], [STATUS_CONFIGMAP])]},
        _binding("RoleBinding", STATUS_ROLE, STATUS_NAMESPACE),
        {"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": NODE_ROLE},
         "rules": [_rule("", ["nodes"], ["get"])]},
        _binding("ClusterRoleBinding", NODE_ROLE, None),
    ]
