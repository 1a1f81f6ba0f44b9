"""The Ray workloads: namespace, service account and what its Ray head may read, hub-token
secret, code ConfigMap and the RayJob (which brings its own Ray cluster). Manifests come from the
pure builders beside this module."""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_kubernetes as k8s

from stack.config import StackConfig
from stack.images import through_cache
from workloads.code_bundle import CodeBundle, configmap
from workloads.kueue import API_VERSION as KUEUE_API, queue_objects
from stack.kube import HF_TOKEN_SECRET, MLFLOW_SECRET, SERVICE_ACCOUNT
from workloads.rayjob import build_rayjob, head_service
from workloads.rbac import head_rbac


def _rbac(name: str, manifest: dict, opts: pulumi.ResourceOptions) -> pulumi.Resource:
    """A Role, ClusterRole or binding from workloads/rbac.py."""
    kind, meta = manifest["kind"], manifest["metadata"]
    if kind in ("Role", "ClusterRole"):
        cls = k8s.rbac.v1.Role if kind == "Role" else k8s.rbac.v1.ClusterRole
        return cls(name, metadata=meta, rules=manifest["rules"], opts=opts)
    cls = k8s.rbac.v1.RoleBinding if kind == "RoleBinding" else k8s.rbac.v1.ClusterRoleBinding
    return cls(name, metadata=meta, role_ref=manifest["roleRef"], subjects=manifest["subjects"],
               opts=opts)


def _custom_resource(name: str, kind: str, manifest: pulumi.Input[dict],
                     opts: pulumi.ResourceOptions,
                     api_version: str = "ray.io/v1") -> k8s.apiextensions.CustomResource:
    """A ray.io/v1 (or Kueue) object from a builder's manifest (a dict, or an Output of one)."""
    m = pulumi.Output.from_input(manifest)
    return k8s.apiextensions.CustomResource(
        name, api_version=api_version, kind=kind, metadata=m.apply(lambda d: d["metadata"]),
        spec=m.apply(lambda d: d["spec"]), opts=opts)


def _queue(name: str, cfg: StackConfig, kueue: pulumi.Resource | None,
           base: pulumi.ResourceOptions, ns: pulumi.Resource) -> pulumi.Resource:
    """Kueue's flavors, ClusterQueue and LocalQueue (workloads/kueue.py), each after the ones it
    names and all after Kueue itself (its webhooks validate them; None: the cluster's own Kueue,
    existingKueue); returns the LocalQueue. Only
    the LocalQueue waits for the namespace: on destroy the ClusterQueue's finalizer
    (kueue.x-k8s.io/resource-in-use) holds it until the namespace's admitted Workloads are gone,
    so it must not be deleted before the namespace is."""
    previous: list[pulumi.Resource] = [kueue] if kueue is not None else []
    for m in queue_objects(cfg):
        after = [*previous, *([ns] if m["kind"] == "LocalQueue" else [])]
        previous = [*previous, _custom_resource(
            f"{name}-{m['kind'].lower()}-{m['metadata']['name']}", m["kind"], m,
            pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=after)),
            api_version=KUEUE_API)]
    return previous[-1]


class RayWorkloads(pulumi.ComponentResource):
    """Depends on the KubeRay operator, so the RayJob (finalizer) is deleted while it runs. No
    long-lived RayCluster: each RayJob brings up its cluster and KubeRay deletes it afterwards."""

    # The RayJob's name and its head's Service (the rayJob and rayHeadService outputs); None
    # when no run is deployed (runJob false or gpuNodeCount 0).
    rayjob_name: pulumi.Output[str] | None
    head_service: pulumi.Output[str] | None

    def __init__(self, name: str, cfg: StackConfig, bundle: CodeBundle,
                 storage_uri: pulumi.Input[str], hf_token: pulumi.Input[str] | None,
                 provider: k8s.Provider, operator: pulumi.Resource | None,
                 pod_identity: pulumi.Resource, image_cache: pulumi.Input[str] | None = None,
                 mlflow_password: pulumi.Input[str] | None = None,
                 kueue: pulumi.Resource | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        """`operator`: this stack's KubeRay operator (None: the cluster's own); `pod_identity`:
        the association that gives the service account its S3 access; `image_cache`: the
        pull-through cache repository for ECR Public images (stack.images), None to pull them
        from ECR Public; `mlflow_password`: the secret mlflowTrackingPassword, None without;
        `kueue`: the Kueue release (stack key queue), None without."""
        super().__init__("eksraytrain:workloads:RayWorkloads", name, None, opts)
        base = pulumi.ResourceOptions(parent=self, provider=provider)
        namespace = cfg.namespace
        # The namespace after the operators, so that `pulumi destroy` deletes it, and with it the
        # RayJobs `python -m runs` submitted (which the stack does not track), while KubeRay and
        # Kueue still run to remove their finalizers (KubeRay 1.7.0 rayjob_controller.go drops
        # ray.io/rayjob-stop-job-finalizer once the RayJob is deleted; Kueue its Workloads'
        # kueue.x-k8s.io/resource-in-use): without them the namespace would stay Terminating.
        controllers = [r for r in (operator, kueue) if r is not None]
        ns = k8s.core.v1.Namespace(f"{name}-ns", metadata={"name": namespace},
                                   opts=pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(
                                       depends_on=controllers)))
        in_ns = pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=[ns]))
        queue = _queue(name, cfg, kueue, base, ns) if cfg.queue else None
        k8s.core.v1.ServiceAccount(f"{name}-sa", metadata={"name": SERVICE_ACCOUNT,
                                                           "namespace": namespace}, opts=in_ns)
        secrets = _secrets(name, cfg, hf_token, mlflow_password, in_ns)
        self.rayjob_name = self.head_service = None
        if cfg.run_job and cfg.gpu_node_count > 0:  # a run of zero GPU nodes never starts
            manifest = pulumi.Output.all(storage_uri, image_cache).apply(
                lambda a: build_rayjob(dataclasses.replace(
                    cfg, image=through_cache(cfg.image, a[1])), bundle, a[0]))
            self.rayjob_name = manifest.apply(lambda m: m["metadata"]["name"])
            self.head_service = self.rayjob_name.apply(head_service)
        # Whenever a run can start, the stack's or a submitted one (runJob false included):
        # every head reads pods, events, nodes and the autoscaler status from its start.
        roles = [_rbac(f"{name}-{m['kind'].lower()}-{m['metadata']['name']}", m, in_ns)
                 for m in head_rbac(namespace, self.rayjob_name, cfg.end_on_scale_up_failure)]
        if self.rayjob_name is not None:
            # KubeRay ignores spec changes of a RayJob ("Disregard changes in RayClusterSpec",
            # rayjob_controller.go), so any change is a new job, and the old one is deleted
            # first: its Ray cluster, and so its GPU nodes, go before the new job asks for them.
            # Its pods get S3 credentials only from an association that exists when they are
            # created, so the RayJob itself depends on it: a component's depends_on would not
            # reach it (pulumi/pulumi source_eval.go inheritFromParent copies only DeletedWith,
            # Protect, RetainOnDelete and Provider from a parent).
            job = _custom_resource(
                f"{name}-rayjob", "RayJob", manifest,
                opts=pulumi.ResourceOptions.merge(in_ns, pulumi.ResourceOptions(
                    # The head reads the API from its start (cold start, scale-up watch).
                    depends_on=[ns, pod_identity, *roles, *secrets,
                                *([operator] if operator else []), *([queue] if queue else [])],
                    # Kueue owns spec.suspend (it unsuspends the RayJob on admission: Kueue's
                    # rayjobs page): a refresh that reads `false` must not replace the run.
                    ignore_changes=["spec.suspend"],
                    replace_on_changes=["metadata.name", "spec"], delete_before_replace=True)))
            _code(f"{name}-code", bundle, job, manifest, in_ns)
        self.register_outputs({})


def _code(name: str, bundle: CodeBundle, job: k8s.apiextensions.CustomResource,
          manifest: pulumi.Output[dict], opts: pulumi.ResourceOptions) -> k8s.core.v1.ConfigMap:
    """The stack's run's own code ConfigMap (workloads/code_bundle.py), owned by its RayJob: made
    after it, since an owner reference needs the uid the API server gave the RayJob. Until it
    exists the run's pods wait in ContainerCreating: kubelet retries a missing ConfigMap volume
    (with Kueue the RayJob is also suspended until admitted)."""
    created = pulumi.Output.all(manifest, job.metadata).apply(lambda a: {
        **a[0], "metadata": {**a[0]["metadata"], "uid": _uid(a[1])}})
    m = created.apply(lambda j: configmap(bundle, j))
    return k8s.core.v1.ConfigMap(name, metadata=m.apply(lambda d: d["metadata"]),
                                 data=bundle.data, opts=pulumi.ResourceOptions.merge(
                                     opts, pulumi.ResourceOptions(depends_on=[job])))


def _uid(metadata) -> str:
    """The uid among a custom resource's output metadata (a dict, or an ObjectMeta)."""
    return metadata["uid"] if isinstance(metadata, dict) else metadata.uid


def _secrets(name: str, cfg: StackConfig, hf_token: pulumi.Input[str] | None,
             mlflow_password: pulumi.Input[str] | None,
             opts: pulumi.ResourceOptions) -> list[k8s.core.v1.Secret]:
    """The Hub token's Secret, and the MLflow credentials' one the pods' env reads (no
    `optional`), which must exist before the RayJob: returned for its depends_on."""
    if hf_token is not None:
        k8s.core.v1.Secret(f"{name}-hf-token", metadata={"name": HF_TOKEN_SECRET,
                                                         "namespace": cfg.namespace},
                           string_data={"token": hf_token}, opts=opts)
    if mlflow_password is None:  # stack/tracking.py: set together with the username
        return []
    return [k8s.core.v1.Secret(
        f"{name}-mlflow", metadata={"name": MLFLOW_SECRET, "namespace": cfg.namespace},
        string_data={"username": cfg.mlflow_tracking_username, "password": mlflow_password},
        opts=opts)]
