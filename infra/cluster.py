"""EKS cluster, its add-ons, and one managed node group per spec of infra/node_groups.py."""

from __future__ import annotations

import json
from typing import Mapping

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from infra.access import admin_access_entries
from infra.kubeconfig import kubeconfigs
from infra.lookups import live_scaling
from infra.network import Network
from infra.node_groups import NodeGroupSpec, launch_template_args, node_groups
from infra.node_health import MONITORING_AGENT_ADDON, monitoring_agent_configuration, repair_config
from infra.policies import NODE_POLICY_ARNS, assume_role
from stack import catalog
from stack.config import StackConfig


class Cluster(pulumi.ComponentResource):
    """pulumi-eks cluster in API authentication mode, no default node group; node groups below.
    (EKS creates the node roles' access entries for managed node groups itself.)"""

    cluster_name: pulumi.Output[str]  # an output: dependents wait for the cluster
    kubeconfig: pulumi.Output[str]  # for the Kubernetes provider, with the stack's profile
    user_kubeconfig: pulumi.Output[str]  # for people: without it
    node_group_names: dict[str, str]  # spec key -> EKS node group name (the nodeGroups output)
    node_roles: dict[str, aws.iam.Role]  # spec key -> its nodes' role
    node_groups: dict[str, aws.eks.NodeGroup]  # spec key -> the group
    eks: eks.Cluster  # pulumi-eks's component
    info: pulumi.Output[aws.eks.Cluster]  # the aws.eks.Cluster inside it

    def __init__(self, name: str, cfg: StackConfig, network: Network,
                 ignore_changes: Mapping[str, tuple[str, ...]], profile: str | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        """`ignore_changes`: spec key -> the group's ignoreChanges, from `scaling_updates`
        (read before any resource)."""
        super().__init__("eksraytrain:infra:Cluster", name, None, opts)
        self.cfg, self.name = cfg, name
        groups = node_groups(cfg)
        self.node_group_names = {g.key: g.name(cfg.name) for g in groups}
        access_entries = admin_access_entries(cfg, name, parent=self)
        roles = {g.key: self._create_node_role(g.key) for g in groups}
        self.node_roles = {key: role for key, (role, _) in roles.items()}
        self.eks = self._create_cluster(network, profile, access_entries)
        # The aws.eks.Cluster inside the component, from the component's own output: unknown in
        # a preview of a new cluster, known once it exists, on every engine. (An invoke after
        # the component would run before the cluster exists on engines before 3.256.0, which
        # gate invokes only on a component's Python-side children: pulumi/runtime/invoke.py;
        # pulumi-eks's examples/cluster-py reads `eks_cluster.version` the same way.)
        # Its vpc_config names the EKS-managed cluster security group, which allows all traffic
        # to and from itself (pulumi-eks's own cluster_security_group_id is another group).
        self.info = self.eks.eks_cluster
        self.cluster_name = self.info.name
        release = catalog.KUBERNETES_RELEASES[cfg.kubernetes_version]
        # Pod Identity gives the Ray pods S3 access without node-wide credentials.
        self._addon("eks-pod-identity-agent", release.pod_identity_agent)
        self.node_groups = {g.key: self._create_nodes(g, network, roles[g.key][1],
                                                      ignore_changes.get(g.key, ()))
                            for g in groups}
        # CoreDNS needs somewhere to run: with no default node group, wait for the untainted
        # (system) nodes. The node monitoring agent (infra/node_health.py) runs on every node.
        system_nodes = [self.node_groups[g.key] for g in groups if not g.taints]
        self._addon("coredns", release.coredns, depends_on=system_nodes)
        self._addon(MONITORING_AGENT_ADDON, release.node_monitoring_agent,
                    monitoring_agent_configuration(), depends_on=system_nodes)
        self.kubeconfig, self.user_kubeconfig = kubeconfigs(
            self.info.name, self.info.endpoint, self.info.certificate_authority.data,
            cfg.region, profile)
        self.register_outputs({"cluster_name": self.cluster_name})

    def _child(self, **kwargs) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, **kwargs)

    def _addon(self, addon: str, version: str, configuration: dict | None = None,
               **kwargs) -> aws.eks.Addon:
        """EKS bootstraps a self-managed CoreDNS; creating the managed add-on over it fails with
        ConfigurationConflict unless EKS may overwrite it (pulumi-eks sets OVERWRITE on its own
        add-ons for this reason, cluster/cluster.ts). `configuration`: its configurationValues."""
        return aws.eks.Addon(f"{self.name}-{addon}", cluster_name=self.cluster_name,
                             addon_name=addon, addon_version=version,
                             configuration_values=json.dumps(configuration) if configuration
                             else None,
                             resolve_conflicts_on_create="OVERWRITE",
                             resolve_conflicts_on_update="OVERWRITE", tags=dict(self.cfg.tags),
                             opts=self._child(**kwargs))

    def _create_node_role(self, kind: str) -> tuple[aws.iam.Role, list[pulumi.Resource]]:
        """The role and its policy attachments: node groups depend on the attachments, so
        `pulumi destroy` detaches the policies only after the nodes have drained."""
        role = aws.iam.Role(f"{self.name}-{kind}-node",
                            assume_role_policy=json.dumps(assume_role("ec2.amazonaws.com")),
                            tags=dict(self.cfg.tags), opts=self._child())
        return role, [aws.iam.RolePolicyAttachment(
            f"{self.name}-{kind}-node-{arn.rsplit('/', 1)[1]}", role=role.name, policy_arn=arn,
            opts=self._child()) for arn in NODE_POLICY_ARNS]

    def _create_cluster(self, network: Network, profile: str | None,
                        access_entries: dict[str, eks.AccessEntryArgs]) -> eks.Cluster:
        cfg = self.cfg
        return eks.Cluster(
            f"{self.name}-cluster", name=cfg.name, version=cfg.kubernetes_version, vpc_id=network.vpc.id,
            public_subnet_ids=[s.id for s in network.public_subnets],
            private_subnet_ids=[s.id for s in network.private_subnets],
            node_associate_public_ip_address=False, skip_default_node_group=True,
            authentication_mode=eks.AuthenticationMode.API,
            access_entries=access_entries,
            endpoint_private_access=True, endpoint_public_access=not cfg.api_private_only,
            public_access_cidrs=None if cfg.api_private_only else list(cfg.api_public_cidrs),
            provider_credential_opts={"profile_name": profile} if profile else None,
            coredns_addon_options={"enabled": False}, tags=dict(cfg.tags), opts=self._child())

    def _create_nodes(self, group: NodeGroupSpec, network: Network,
                      policies: list[pulumi.Resource],
                      ignore_changes: tuple[str, ...]) -> aws.eks.NodeGroup:
        """A hand-built launch template (and an EFA group's cluster placement group) and the
        group in its zones. Plain `aws.eks.NodeGroup`s: pulumi-eks's ManagedNodeGroup sets
        `version` only without a launch template, so cluster upgrades would never roll these
        nodes (nodes/nodegroup.ts), and its `enable_efa_support` refuses a user launch template.
        Node groups have fixed names (stack outputs, kubectl): a replacement (new instance type,
        subnets) must delete the old group first, or EKS refuses the second one of that name."""
        cfg, key = self.cfg, group.key
        placement = None
        if group.placement_group:
            placement = aws.ec2.PlacementGroup(f"{self.name}-{key}-pg", strategy="cluster",
                                               tags=dict(cfg.tags), opts=self._child()).name
        template = aws.ec2.LaunchTemplate(
            f"{self.name}-{key}-lt", **launch_template_args(
                group, cfg.tags, placement, self.info.vpc_config.cluster_security_group_id),
            opts=self._child())
        return aws.eks.NodeGroup(
            f"{self.name}-{key}", cluster_name=self.cluster_name,
            node_role_arn=self.node_roles[key].arn, node_group_name=group.name(cfg.name),
            version=cfg.kubernetes_version,
            # A Capacity Block names its instance type in the launch template only.
            instance_types=None if group.capacity_block else [group.instance_type],
            ami_type=group.ami_type, capacity_type=group.capacity_type,
            scaling_config=group.scaling(),
            subnet_ids=[s.id for s in network.private_subnets[:group.zones]],
            labels=dict(group.labels), taints=list(group.taints) or None,
            node_repair_config=repair_config(group.auto_repair),
            launch_template=_template_ref(template),
            tags={**cfg.tags, **group.autoscaler_tags()},
            opts=self._child(depends_on=policies, delete_before_replace=True,
                             ignore_changes=list(ignore_changes)))


def scaling_updates(cfg: StackConfig) -> dict[str, tuple[str, ...]]:
    """Each autoscaled group's ignoreChanges from its live scaling (NodeGroupSpec.scaling_update);
    raises ConfigError. Plain reads: call it before any resource."""
    return {g.key: g.scaling_update(live_scaling(cfg.name, g.name(cfg.name)), cfg.name)
            for g in node_groups(cfg) if g.autoscaled}


def _template_ref(template: aws.ec2.LaunchTemplate) -> dict:
    return {"id": template.id, "version": template.latest_version.apply(str)}
