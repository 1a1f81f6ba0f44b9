"""EKS cluster, its add-ons, and the system and GPU managed node groups."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from infra.access import admin_access_entries
from infra.kubeconfig import kubeconfigs
from infra.lookups import node_group_desired_size
from infra.network import Network
from infra.policies import NODE_POLICY_ARNS, assume_role
from infra.root_volumes import SYSTEM_ROOT, RootVolume, gpu_root
from infra.user_data import launch_template_user_data
from stack import catalog
from stack.config import StackConfig
from stack.kube import GPU_TAINT, SYSTEM_LABELS, gpu_node_labels

# cluster-autoscaler reads extra allocatable resources of a node group at zero nodes from these
# node-group tags (cloudprovider/aws aws_manager.go, through eks:DescribeNodegroup since 1.28): its
# instance table knows GPUs but not EFA interfaces.
NODE_TEMPLATE_RESOURCE_TAG = "k8s.io/cluster-autoscaler/node-template/resources/"
EFA_RESOURCE = "vpc.amazonaws.com/efa"


class Cluster(pulumi.ComponentResource):
    """pulumi-eks cluster in API authentication mode, no default node group; node groups below.
    (EKS creates the node roles' access entries for managed node groups itself.)"""

    def __init__(self, name: str, cfg: StackConfig, network: Network, profile: str | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("eksraytrain:infra:Cluster", name, None, opts)
        self.cfg, self.name = cfg, name
        # Plain reads, before any resource: who gets access, the GPU group's live size.
        access_entries = admin_access_entries(cfg)
        self.system_group, self.gpu_group = f"{cfg.name}-system", f"{cfg.name}-gpu"
        self.gpu_live_size = node_group_desired_size(cfg.name, self.gpu_group)
        self.system_role, system_policies = self._create_node_role("system")
        self.gpu_role, gpu_policies = self._create_node_role("gpu")
        self.eks = self._create_cluster(network, profile, access_entries)
        # The created cluster as AWS reports it: its name (an output, so dependents wait for the
        # cluster) and the EKS-managed cluster security group, which allows all traffic to and
        # from itself (pulumi-eks's own cluster_security_group_id is another group).
        self.info = aws.eks.get_cluster_output(
            name=cfg.name, opts=pulumi.InvokeOutputOptions(depends_on=[self.eks]))
        self.cluster_name = self.info.name
        release = catalog.KUBERNETES_RELEASES[cfg.kubernetes_version]
        # Pod Identity gives the Ray pods S3 access without node-wide credentials.
        self._addon("eks-pod-identity-agent", release.pod_identity_agent)
        self.system_nodes = self._create_system_nodes(network, system_policies)
        # CoreDNS needs somewhere to run: with no default node group, wait for the system nodes.
        self._addon("coredns", release.coredns, depends_on=[self.system_nodes])
        self.gpu_nodes = self._create_gpu_nodes(network, gpu_policies)
        self.kubeconfig, self.user_kubeconfig = kubeconfigs(
            self.info.name, self.info.endpoint, self.info.certificate_authorities[0].data,
            cfg.region, profile)
        self.register_outputs({"cluster_name": self.cluster_name})

    def _child(self, **kwargs) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, **kwargs)

    def _addon(self, addon: str, version: str, **kwargs) -> aws.eks.Addon:
        """EKS bootstraps a self-managed CoreDNS; creating the managed add-on over it fails with
        ConfigurationConflict unless EKS may overwrite it (pulumi-eks sets OVERWRITE on its own
        add-ons for this reason, cluster/cluster.ts)."""
        return aws.eks.Addon(f"{self.name}-{addon}", cluster_name=self.cluster_name,
                             addon_name=addon, addon_version=version,
                             resolve_conflicts_on_create="OVERWRITE",
                             resolve_conflicts_on_update="OVERWRITE", opts=self._child(**kwargs))

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

    def _create_system_nodes(self, network: Network,
                             policies: list[pulumi.Resource]) -> aws.eks.NodeGroup:
        """Node groups have fixed names (stack outputs, kubectl): a replacement (new instance
        type, subnets) must delete the old group first, or EKS refuses the second one of that
        name."""
        cfg = self.cfg
        n = cfg.system_node_count
        template = aws.ec2.LaunchTemplate(
            f"{self.name}-system-lt",
            **node_launch_template_args(cfg, SYSTEM_ROOT, cfg.system),
            opts=self._child())
        return aws.eks.NodeGroup(
            f"{self.name}-system", cluster_name=self.cluster_name, node_role_arn=self.system_role.arn,
            node_group_name=self.system_group, version=cfg.kubernetes_version,
            instance_types=[cfg.system_instance_type], ami_type="AL2023_x86_64_STANDARD",
            scaling_config={"desired_size": n, "min_size": n, "max_size": n},
            subnet_ids=[s.id for s in network.private_subnets], labels=SYSTEM_LABELS,
            launch_template=_template_ref(template), tags=dict(cfg.tags),
            opts=self._child(depends_on=policies, delete_before_replace=True))

    def _create_gpu_nodes(self, network: Network,
                          policies: list[pulumi.Resource]) -> aws.eks.NodeGroup:
        """EFA node group in one zone, scaled from zero by cluster-autoscaler up to
        `gpuNodeCount`: a hand-built launch template with the EKS-managed cluster security group
        (all traffic to and from itself) and, without a reservation, a cluster placement group.

        Plain `aws.eks.NodeGroup`s: pulumi-eks's ManagedNodeGroup sets `version` only without a
        launch template, so cluster upgrades would never roll these nodes (nodes/nodegroup.ts),
        and its `enable_efa_support` refuses a user launch template."""
        cfg = self.cfg
        placement = None
        if not cfg.reserved:  # a reservation made outside the group may not serve launches into it
            placement = aws.ec2.PlacementGroup(f"{self.name}-gpu-pg", strategy="cluster",
                                               tags=dict(cfg.tags), opts=self._child()).name
        max_size = max(cfg.gpu_node_count, 1)
        template = aws.ec2.LaunchTemplate(
            f"{self.name}-gpu-lt", **gpu_launch_template_args(
                cfg, placement, self.info.vpc_config.cluster_security_group_id),
            opts=self._child())
        return aws.eks.NodeGroup(
            f"{self.name}-gpu", cluster_name=self.cluster_name, node_role_arn=self.gpu_role.arn,
            node_group_name=self.gpu_group, version=cfg.kubernetes_version,
            # A Capacity Block names its instance type in the launch template only (EKS user
            # guide ml/capacity-blocks-mng); the node group must not list it again.
            instance_types=None if cfg.capacity_block else [cfg.gpu_instance_type],
            ami_type="AL2023_x86_64_NVIDIA",
            capacity_type="CAPACITY_BLOCK" if cfg.capacity_block else "ON_DEMAND",
            # From zero: the autoscaler adds nodes for pending Ray worker pods. EKS requires
            # max >= 1, so gpuNodeCount 0 keeps a cap of 1 that no pod asks for.
            scaling_config={"desired_size": gpu_desired_size(self.gpu_live_size, max_size),
                            "min_size": 0, "max_size": max_size},
            subnet_ids=[network.gpu_subnet_id], labels=gpu_node_labels(cfg.gpu.accelerator),
            taints=[GPU_TAINT], launch_template=_template_ref(template),
            tags={**cfg.tags, **autoscaler_node_template_tags(cfg)},
            opts=self._child(depends_on=policies, delete_before_replace=True))


def _template_ref(template: aws.ec2.LaunchTemplate) -> dict:
    return {"id": template.id, "version": template.latest_version.apply(str)}


def gpu_desired_size(live: int | None, max_size: int) -> int:
    """The GPU group's desired size to declare: the live one (0 before the group exists),
    capped by the new maximum (EKS requires desired <= max). cluster-autoscaler owns the size,
    and any change of the scaling block makes the aws provider send all of it
    (terraform-provider-aws internal/service/eks/node_group.go, resourceNodeGroupUpdate:
    UpdateNodegroupConfig with expandNodegroupScalingConfig of the whole block). With
    `ignoreChanges` on the desired size the provider would send the size in Pulumi's state
    instead: 0 while a run holds nodes, or a stale 2 after a `pulumi refresh` during a run
    (refresh stores live inputs; ignoreChanges only hides the diff, pulumi/pulumi#16146). The
    live size makes a scaling change keep whatever the autoscaler set, in both directions."""
    return min(live or 0, max_size)


def autoscaler_node_template_tags(cfg: StackConfig) -> dict[str, str]:
    """What cluster-autoscaler cannot know about a GPU node before one exists: its EFA devices."""
    return {f"{NODE_TEMPLATE_RESOURCE_TAG}{EFA_RESOURCE}": str(cfg.gpu.efa_interfaces)}


def node_launch_template_args(cfg: StackConfig, root: RootVolume,
                              facts: catalog.InstanceFacts) -> dict:
    """What every node's launch template sets: IMDSv2 with hop limit 1, so pods cannot reach the
    node role's credentials (they use Pod Identity, which needs no metadata service), an
    encrypted gp3 root volume sized for image pulls, and nodeadm's FastImagePull gate where the
    instance type honours it (infra/root_volumes.py, infra/user_data.py)."""
    args = {
        "metadata_options": {"http_endpoint": "enabled", "http_tokens": "required",
                             "http_put_response_hop_limit": 1},
        "block_device_mappings": [{"device_name": "/dev/xvda", "ebs": root.ebs()}],
        "tag_specifications": [{"resource_type": "instance", "tags": dict(cfg.tags)}],
    }
    user_data = launch_template_user_data(facts)
    if user_data is not None:
        args["user_data"] = user_data
    return args


def gpu_launch_template_args(cfg: StackConfig, placement_group: pulumi.Input[str] | None,
                             security_group_id: pulumi.Input[str]) -> dict:
    """Launch-template inputs for the EFA GPU nodes (pure: tested without Pulumi's engine)."""
    args = node_launch_template_args(cfg, gpu_root(cfg.root_volume_gib), cfg.gpu)
    args["network_interfaces"] = efa_network_interfaces(cfg.gpu.efa_interfaces, security_group_id)
    if placement_group is not None:
        args["placement"] = {"group_name": placement_group}
    if cfg.reserved:
        args["capacity_reservation_specification"] = {"capacity_reservation_target": {
            "capacity_reservation_id": cfg.reserved.id}}
    if cfg.capacity_block:
        args["instance_market_options"] = {"market_type": "capacity-block"}
        args["instance_type"] = cfg.gpu_instance_type
    return args


def efa_network_interfaces(count: int, security_group_id: pulumi.Input[str]) -> list[dict]:
    """One EFA interface per network card, as many as the pods request (p5.48xlarge: 32): the
    EC2 user guide (efa-acc-inst-types, "EFA configuration for P5") puts the primary on network
    card 0 / device index 0 and each further one on the next network card with device index 1.
    Every EFA carries the security group that allows all traffic to and from itself (efa-start)."""
    return [{"device_index": 0 if card == 0 else 1, "network_card_index": card,
             "interface_type": "efa", "security_groups": [security_group_id],
             "delete_on_termination": "true"} for card in range(count)]
