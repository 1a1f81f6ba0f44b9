"""What the Ray head may read (and, for a run that cannot start, change) in the Kubernetes API:
pure builders of rbac.authorization.k8s.io/v1 objects, the least scope that works.

The head reads its run's worker pods (list by label selector) and the namespace's events (the
kubelet's image pulls, cluster-autoscaler's scale-up events: training/head/cold_start.py and
training/head/scaleup.py), gets the GPU nodes those pods run on (cluster-scoped, so a ClusterRole;
`get` by name only, no `list`), and gets one ConfigMap in kube-system, cluster-autoscaler's
status. On its own RayJob (by name) it may `get` (the creation time) and, when
endOnScaleUpFailure is on, `patch` (to end a run that cannot start). Nothing else, and no write
anywhere else. A `list` under resourceNames is allowed only for one object named by a
`metadata.name` field selector (Kubernetes RBAC docs, "Referring to resources"), so the pod and
event lists are namespace-wide: the stack's Ray namespace holds only its Ray objects.

The subject is `ray-train`, the service account of every Ray pod, GPU workers included: Pod
Identity maps that one account to the bucket role (infra/storage.py), and the head needs the
bucket too. A head-only account would need a second association.

A run `python -m runs` submits is not known when the stack is deployed: `run_rbac` gives its head
the same access to its own RayJob, in a Role owned by that RayJob (the garbage collector deletes
it with the run: Kubernetes docs, "Owners and Dependents"); pods and events it reads through the
stack's Role above, which is namespace-wide.
"""

from __future__ import annotations

from stack.kube import SERVICE_ACCOUNT
from workloads.owners import owned_by
from training.head.scaleup import STATUS_CONFIGMAP, STATUS_NAMESPACE

RBAC = "rbac.authorization.k8s.io/v1"
# In the stack's namespace; the objects outside it carry the namespace in their names, since
# stacks that share an existing cluster have a namespace each (StackConfig.namespace).
ROLE = "ray-head-reader"


def _rule(group: str, resources: list[str], verbs: list[str],
          names: list[str] | None = None) -> dict:
    rule = {"apiGroups": [group], "resources": resources, "verbs": verbs}
    if names:
        rule["resourceNames"] = names
    return rule


def _binding(kind: str, name: str, namespace: str | None, subject_namespace: str) -> dict:
    role_kind = "ClusterRole" if kind == "ClusterRoleBinding" else "Role"
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": RBAC, "kind": kind, "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                          "namespace": subject_namespace}]}


def _rayjob_rule(rayjob_name: str, end_on_scaleup_failure: bool) -> dict:
    """`get` its own RayJob (the creation time) and, to end a run that cannot start, `patch`."""
    verbs = ["get", "patch"] if end_on_scaleup_failure else ["get"]
    return _rule("ray.io", ["rayjobs"], verbs, [rayjob_name])


def head_rbac(namespace: str, rayjob_name: str | None,
              end_on_scaleup_failure: bool) -> list[dict]:
    """Roles and bindings for the service account of the Ray pods in `namespace` (the stack's,
    StackConfig.namespace), on every stack: a run `python -m runs` submits to a `runJob: false`
    stack reads pods, events, nodes and the autoscaler status through these too. `rayjob_name`:
    the stack's own RayJob (a Pulumi Output: the name hashes the storage URI; the builder only
    places it), None without one (a submitted run's own RayJob rule is `run_rbac`'s)."""
    rules = [_rule("", ["pods"], ["list"]), _rule("", ["events"], ["list"])]
    if rayjob_name is not None:
        rules.append(_rayjob_rule(rayjob_name, end_on_scaleup_failure))
    status_role, nodes_role = f"{namespace}-head-autoscaler-status", f"{namespace}-head-nodes"
    return [
        {"apiVersion": RBAC, "kind": "Role", "metadata": {"name": ROLE, "namespace": namespace},
         "rules": rules},
        _binding("RoleBinding", ROLE, namespace, namespace),
        {"apiVersion": RBAC, "kind": "Role",
         "metadata": {"name": status_role, "namespace": STATUS_NAMESPACE},
         "rules": [_rule("", ["configmaps"], ["get"], [STATUS_CONFIGMAP])]},
        _binding("RoleBinding", status_role, STATUS_NAMESPACE, namespace),
        {"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": nodes_role},
         "rules": [_rule("", ["nodes"], ["get"])]},
        _binding("ClusterRoleBinding", nodes_role, None, namespace),
    ]


def run_rbac(job: dict) -> list[dict]:
    """The Role and RoleBinding that let a submitted run's head read (and, where its scale-up
    watch may end the run, patch) its own RayJob `job`, as created (with its uid): both owned by
    the RayJob, so they go when it does. The watch's flag is read from the head's manifest, the
    one place the stack's endOnScaleUpFailure reaches."""
    meta = job["metadata"]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
    ends = any("--end-on-scaleup-failure" in c.get("command", []) for c in head)
    owners = owned_by(job)
    name = f"{meta['name']}-head"
    role = {"apiVersion": RBAC, "kind": "Role", "metadata": {"name": name},
            "rules": [_rayjob_rule(meta["name"], ends)]}
    binding = _binding("RoleBinding", name, None, meta["namespace"])
    for obj in (role, binding):
        obj["metadata"].update(namespace=meta["namespace"], ownerReferences=owners)
    return [role, binding]
