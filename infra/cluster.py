"""EKS cluster, its add-ons, and the system and GPU managed node groups."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from stack.config import StackConfig
from infra.network import Network
from stack.kube import GPU_LABELS, GPU_TAINT, SYSTEM_LABELS
from infra.policies import CLUSTER_ADMIN_POLICY_ARN, NODE_POLICY_ARNS, assume_role


class Cluster(pulumi.ComponentResource):
    """pulumi-eks cluster in API authentication mode, no default node group; node groups below.
    (EKS creates the node roles' access entries for managed node groups itself.)"""

    def __init__(self, name: str, cfg: StackConfig, network: Network,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("eksraytrain:infra:Cluster", name, None, opts)
        self.cfg, self.name = cfg, name
        self.system_role = self._create_node_role("system")
        self.gpu_role = self._create_node_role("gpu")
        self.eks = self._create_cluster(network)
        # The created cluster as AWS reports it: its name (an output, so dependents wait for the
        # cluster) and the EKS-managed cluster security group, which allows all traffic to and
        # from itself (pulumi-eks's own cluster_security_group_id is another group).
        self.info = aws.eks.get_cluster_output(
            name=cfg.name, opts=pulumi.InvokeOutputOptions(depends_on=[self.eks]))
        self.cluster_name = self.info.name
        # Pod Identity gives the Ray pods S3 access without node-wide credentials.
        aws.eks.Addon(f"{name}-pod-identity", cluster_name=self.cluster_name,
                      addon_name="eks-pod-identity-agent", opts=self._child())
        self.system_nodes = self._create_system_nodes(network)
        # CoreDNS needs somewhere to run: with no default node group, wait for the system nodes.
        aws.eks.Addon(f"{name}-coredns", cluster_name=self.cluster_name, addon_name="coredns",
                      opts=self._child(depends_on=[self.system_nodes]))
        self.gpu_nodes = self._create_gpu_nodes(network)
        self.kubeconfig = pulumi.Output.secret(self.eks.kubeconfig_json)
        self.register_outputs({"cluster_name": self.cluster_name})

    def _child(self, **kwargs) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, **kwargs)

    def _create_node_role(self, kind: str) -> aws.iam.Role:
        role = aws.iam.Role(f"{self.name}-{kind}-node",
                            assume_role_policy=json.dumps(assume_role("ec2.amazonaws.com")),
                            tags=dict(self.cfg.tags), opts=self._child())
        for arn in NODE_POLICY_ARNS:
            aws.iam.RolePolicyAttachment(f"{self.name}-{kind}-node-{arn.rsplit('/', 1)[1]}",
                                         role=role.name, policy_arn=arn, opts=self._child())
        return role

    def _create_cluster(self, network: Network) -> eks.Cluster:
        cfg = self.cfg
        access = {}
        if cfg.admin_principal_arn:
            access["admin"] = eks.AccessEntryArgs(
                principal_arn=cfg.admin_principal_arn,
                access_policies={"cluster-admin": eks.AccessPolicyAssociationArgs(
                    policy_arn=CLUSTER_ADMIN_POLICY_ARN,
                    access_scope={"type": "cluster"})})
        return eks.Cluster(
            f"{self.name}-cluster", name=cfg.name, version=cfg.kubernetes_version, vpc_id=network.vpc.id,
            public_subnet_ids=[s.id for s in network.public_subnets],
            private_subnet_ids=[s.id for s in network.private_subnets],
            node_associate_public_ip_address=False, skip_default_node_group=True,
            authentication_mode=eks.AuthenticationMode.API, access_entries=access,
            endpoint_private_access=True, endpoint_public_access=not cfg.api_private_only,
            public_access_cidrs=None if cfg.api_private_only else list(cfg.api_public_cidrs),
            coredns_addon_options={"enabled": False}, tags=dict(cfg.tags), opts=self._child())

    def _create_system_nodes(self, network: Network) -> eks.ManagedNodeGroup:
        cfg = self.cfg
        n = cfg.system_node_count
        return eks.ManagedNodeGroup(
            f"{self.name}-system", cluster=self.eks, node_role_arn=self.system_role.arn,
            node_group_name=f"{cfg.name}-system",
            instance_types=[cfg.system_instance_type], ami_type="AL2023_x86_64_STANDARD",
            scaling_config={"desired_size": n, "min_size": n, "max_size": n},
            subnet_ids=[s.id for s in network.private_subnets], labels=SYSTEM_LABELS,
            tags=dict(cfg.tags), opts=self._child())

    def _create_gpu_nodes(self, network: Network) -> eks.ManagedNodeGroup:
        """EFA node group in one zone: a hand-built launch template, a cluster placement group,
        and the EKS-managed cluster security group, which allows all traffic to and from itself.

        pulumi-eks's `enable_efa_support` does not fit here even without a reservation: it
        refuses a user launch template, and the template it generates sets only the root volume's
        size (no gp3, no encryption; nodes/nodegroup.ts in pulumi-eks). One template of ours
        serves the plain, reserved and Capacity Block cases alike."""
        cfg = self.cfg
        n = cfg.gpu_node_count
        placement = aws.ec2.PlacementGroup(f"{self.name}-gpu-pg", strategy="cluster",
                                           tags=dict(cfg.tags), opts=self._child())
        template = aws.ec2.LaunchTemplate(
            f"{self.name}-gpu-lt", **gpu_launch_template_args(
                cfg, placement.name, self.info.vpc_config.cluster_security_group_id),
            opts=self._child())
        return eks.ManagedNodeGroup(
            f"{self.name}-gpu", cluster=self.eks, node_role_arn=self.gpu_role.arn,
            node_group_name=f"{cfg.name}-gpu",
            instance_types=[cfg.gpu_instance_type], ami_type="AL2023_x86_64_NVIDIA",
            capacity_type="CAPACITY_BLOCK" if cfg.capacity_block else "ON_DEMAND",
            # Paused at 0 nodes: max stays >= 1 (EKS requires it); min = desired = 0 costs nothing.
            scaling_config={"desired_size": n, "min_size": n, "max_size": max(n, 1)},
            subnet_ids=[network.gpu_subnet_id], labels=GPU_LABELS, taints=[GPU_TAINT],
            launch_template={"id": template.id,
                             "version": template.latest_version.apply(str)},
            tags=dict(cfg.tags), opts=self._child())


def gpu_launch_template_args(cfg: StackConfig, placement_group: pulumi.Input[str],
                             security_group_id: pulumi.Input[str]) -> dict:
    """Launch-template inputs for the EFA GPU nodes (pure: tested without Pulumi's engine)."""
    args = {
        "network_interfaces": [{
            "device_index": 0, "network_card_index": 0, "interface_type": "efa",
            "security_groups": [security_group_id], "delete_on_termination": "true"}],
        "placement": {"group_name": placement_group},
        "metadata_options": {"http_endpoint": "enabled", "http_tokens": "required",
                             "http_put_response_hop_limit": 2},
        "block_device_mappings": [{"device_name": "/dev/xvda", "ebs": {
            "volume_size": cfg.root_volume_gib, "volume_type": "gp3", "encrypted": "true",
            "delete_on_termination": "true"}}],
        "tag_specifications": [{"resource_type": "instance", "tags": dict(cfg.tags)}],
    }
    if cfg.capacity_reservation:
        args["capacity_reservation_specification"] = {"capacity_reservation_target": {
            "capacity_reservation_id": cfg.capacity_reservation.id}}
    if cfg.capacity_block:
        args["instance_market_options"] = {"market_type": "capacity-block"}
        args["capacity_reservation_specification"] = {"capacity_reservation_target": {
            "capacity_reservation_id": cfg.capacity_block.id}}
    return args
