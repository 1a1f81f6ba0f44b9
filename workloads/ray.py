"""The Ray workloads: namespace, service account, hub-token secret, code ConfigMap, RayCluster
and (optionally) the RayJob. Manifests come from the pure builders beside this module."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from stack.config import StackConfig
from workloads.code_bundle import CodeBundle
from stack.kube import CODE_CONFIGMAP, HF_TOKEN_SECRET, NAMESPACE, SERVICE_ACCOUNT
from workloads.raycluster import build_raycluster
from workloads.rayjob import build_rayjob


def _custom_resource(name: str, kind: str, manifest: pulumi.Input[dict],
                     opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    """A ray.io/v1 object from a builder's manifest (a dict, or an Output of one)."""
    m = pulumi.Output.from_input(manifest)
    return k8s.apiextensions.CustomResource(
        name, api_version="ray.io/v1", kind=kind, metadata=m.apply(lambda d: d["metadata"]),
        spec=m.apply(lambda d: d["spec"]), opts=opts)


class RayWorkloads(pulumi.ComponentResource):
    """Depends on the KubeRay operator, so RayJob and RayCluster (finalizers) are deleted first."""

    def __init__(self, name: str, cfg: StackConfig, bundle: CodeBundle,
                 storage_uri: pulumi.Input[str], hf_token: pulumi.Input[str] | None,
                 provider: k8s.Provider, operator: pulumi.Resource,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("eksraytrain:workloads:RayWorkloads", name, None, opts)
        base = pulumi.ResourceOptions(parent=self, provider=provider)
        ns = k8s.core.v1.Namespace(f"{name}-ns", metadata={"name": NAMESPACE}, opts=base)
        in_ns = pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=[ns]))
        k8s.core.v1.ServiceAccount(f"{name}-sa", metadata={"name": SERVICE_ACCOUNT,
                                                           "namespace": NAMESPACE}, opts=in_ns)
        if hf_token is not None:
            k8s.core.v1.Secret(f"{name}-hf-token", metadata={"name": HF_TOKEN_SECRET,
                                                             "namespace": NAMESPACE},
                               string_data={"token": hf_token}, opts=in_ns)
        code = k8s.core.v1.ConfigMap(f"{name}-code", metadata={"name": CODE_CONFIGMAP,
                                                               "namespace": NAMESPACE},
                                     data=bundle.data, opts=in_ns)
        after_operator = pulumi.ResourceOptions.merge(in_ns, pulumi.ResourceOptions(
            depends_on=[ns, operator]))
        self.raycluster = _custom_resource(f"{name}-raycluster", "RayCluster", build_raycluster(cfg),
                                           after_operator)
        self.rayjob_name = None
        if cfg.run_job:
            manifest = pulumi.Output.from_input(storage_uri).apply(
                lambda uri: build_rayjob(cfg, bundle, uri))
            self.rayjob_name = manifest.apply(lambda m: m["metadata"]["name"])
            _custom_resource(
                f"{name}-rayjob", "RayJob", manifest,
                opts=pulumi.ResourceOptions.merge(after_operator, pulumi.ResourceOptions(
                    depends_on=[ns, operator, self.raycluster, code],
                    replace_on_changes=["metadata.name"], delete_before_replace=False)))
        self.register_outputs({"raycluster": cfg.name})
