"""Cluster add-ons: KubeRay (with its CRDs from the pinned release) unless the cluster runs its
own, NVIDIA and EFA device plugins, and cluster-autoscaler for the GPU nodes of a cluster this
stack owns."""

from __future__ import annotations

from typing import Mapping

import pulumi
import pulumi_kubernetes as k8s

from stack.catalog import CHARTS
from workloads import helm_values


class Addons(pulumi.ComponentResource):
    """Installed once the system nodes exist. Device-plugin DaemonSets are not awaited: their
    GPU nodes sit at zero between runs. Everything here depends on the node groups, so on destroy
    it goes first, while nodes still run its finalizers."""

    kuberay: k8s.helm.v3.Release | None  # this stack's operator; None: the cluster's own
    nvidia: k8s.helm.v3.Release  # the NVIDIA device plugin
    efa: k8s.helm.v3.Release  # the EFA device plugin
    kueue: k8s.helm.v3.Release | None  # Kueue (stack key queue); None when it is off

    def __init__(self, name: str, provider: k8s.Provider, depends_on: list[pulumi.Resource],
                 system_node_selector: dict[str, str], region: str,
                 kuberay_crds: Mapping[str, str] | None, autoscaler_values: dict | None = None,
                 crd_provider: k8s.Provider | None = None, kueue_namespace: str | None = None,
                 kueue_release: str | None = None, opts: pulumi.ResourceOptions | None = None):
        """`kuberay_crds`: kind -> CRD text of the pinned release, applied with the operator;
        None when the cluster runs its own KubeRay (no second operator, its CRDs untouched).
        `crd_provider`: a shared cluster's, which adopts CRDs that are already there; they are
        then left in place on destroy. `autoscaler_values`: install cluster-autoscaler (own
        cluster only). `kueue_namespace`: install Kueue, which queues the RayJobs of that namespace
        (workloads/kueue.py) and nothing else (helm_values.kueue_manager_config), as the Helm
        release `kueue_release` (None: Pulumi's auto-name)."""
        super().__init__("eksraytrain:workloads:Addons", name, None, opts)
        base = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=depends_on)
        self.kuberay = None
        if kuberay_crds is not None:
            # Helm installs crds/ once and never upgrades them; applying the pinned release's
            # CRDs ourselves (server-side: they exceed the 256 KiB last-applied annotation)
            # upgrades them with the pinned version. On a shared cluster other stacks' RayJobs
            # live in them: destroying this stack must not delete them.
            crd_opts = pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(
                provider=crd_provider or provider, retain_on_delete=crd_provider is not None))
            crds = [k8s.yaml.v2.ConfigGroup(f"{name}-crd-{kind.lower()}", yaml=text, opts=crd_opts)
                    for kind, text in kuberay_crds.items()]
            self.kuberay = self._release(name, "kuberay-operator",
                                         helm_values.kuberay_operator(system_node_selector),
                                         pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(
                                             depends_on=[*depends_on, *crds])), skip_crds=True)
        self.nvidia = self._release(name, "nvidia-device-plugin", helm_values.nvidia_device_plugin(),
                                    base, skip_await=True)
        self.efa = self._release(name, "aws-efa-k8s-device-plugin", helm_values.efa_device_plugin(region),
                                 base, skip_await=True)
        if autoscaler_values is not None:
            self._release(name, "cluster-autoscaler", autoscaler_values, base)
        # Awaited: its webhooks must answer before the queue objects and RayJobs are created.
        # After KubeRay: its RayJob integration finds the CRD when it starts, and no KubeRay
        # object is created while Kueue's webhooks are registered but not yet serving (Helm
        # does not retry a refused create). With our values none of them covers KubeRay's
        # namespace anyway (helm_values.kueue_manager_config).
        self.kueue = None
        if kueue_namespace is not None:
            after = [*depends_on, *([self.kuberay] if self.kuberay else [])]
            self.kueue = self._release(
                name, "kueue", helm_values.kueue(system_node_selector, kueue_namespace),
                pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=after)),
                release_name=kueue_release)
        self.register_outputs({})

    def _release(self, name: str, chart_key: str, values: dict, opts: pulumi.ResourceOptions,
                 release_name: str | None = None, **kwargs) -> k8s.helm.v3.Release:
        """`release_name`: the Helm release's; None: `<resource name>-<8 hex>` (the provider's
        auto-name, helm_release.go assignNameIfAutonameable)."""
        chart = CHARTS[chart_key]
        repo = {"repository_opts": {"repo": chart.repo}} if chart.repo else {}  # "": an OCI chart
        named = {"name": release_name} if release_name else {}
        return k8s.helm.v3.Release(
            f"{name}-{chart_key}", chart=chart.name, version=chart.version, **repo, **named,
            namespace=chart.namespace,
            create_namespace=True, values=values, opts=opts, **kwargs)
