"""The stack's own node groups as data: one NodeGroupSpec per group (the system group and the GPU
group). The cluster declares each group's role, launch template and node group from its spec, the
quota check counts its vCPUs, the cost outputs price its nodes and root volumes, the program
exports its name: a new group is one entry in `node_groups`. Pure (typed config in, specs and
launch-template inputs out), tested without Pulumi's engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from infra.root_volumes import SYSTEM_ROOT, RootVolume, gpu_root
from infra.user_data import launch_template_user_data
from stack.catalog import CAPACITY_BLOCK, ON_DEMAND, GpuCapacity, InstanceFacts, ServiceQuota
from stack.config import ConfigError, Reservation, StackConfig
from stack.kube import END_A_RUN, GPU_TAINT, SYSTEM_LABELS, gpu_node_labels

if TYPE_CHECKING:  # only the type: the builders place Outputs, they never read them
    from pulumi import Input

# cluster-autoscaler reads extra allocatable resources of a node group at zero nodes from these
# node-group tags (cloudprovider/aws aws_manager.go, through eks:DescribeNodegroup since 1.28): its
# instance table knows GPUs but not EFA interfaces.
NODE_TEMPLATE_RESOURCE_TAG = "k8s.io/cluster-autoscaler/node-template/resources/"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# What a launch template tags at launch besides the instance: its EBS volumes (gp3 with paid
# throughput and IOPS) and its network interfaces (the EFA ones).
LAUNCHED_RESOURCE_TYPES = ("instance", "volume", "network-interface")
DESIRED_SIZE = "scalingConfig.desiredSize"  # the path `ignoreChanges` names


@dataclass(frozen=True)
class LiveScaling:
    """A node group's scaling as EKS reports it when the program starts (infra/lookups.py)."""

    desired: int
    max: int


@dataclass(frozen=True)
class NodeGroupSpec:
    """One managed node group. `key` names its resources (`eks-<key>`, `eks-<key>-lt`), its
    entry in the nodeGroups output and its EKS name (`<clusterName>-<key>`)."""

    key: str
    count_key: str  # the config key of its node count, for messages
    instance_type: str
    facts: InstanceFacts
    nodes: int  # its nodes while a run goes (a fixed group's always)
    ami_type: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]
    root: RootVolume
    zones: int  # it spans the first `zones` private subnets, the GPU zone first
    # Sized by cluster-autoscaler from zero for a run's pods; otherwise fixed at `nodes`.
    autoscaled: bool
    # EFA interfaces on every network card, in a cluster placement group unless reserved.
    efa: bool = False
    counts_vcpu_quota: bool = True  # its launches count against its capacity's vCPU quota
    reservation: Reservation | None = None  # the reservation or Capacity Block it launches into
    # How its nodes are bought (the stack config's record for the GPU group). None: declared
    # without one, EKS's default (On-Demand). A change replaces the group (capacity_type is
    # ForceNew in terraform-provider-aws internal/service/eks/node_group.go).
    capacity: GpuCapacity | None = None
    # EKS node auto repair (infra/node_health.py repair_config): reboot or replace a sick node.
    auto_repair: bool = False

    def name(self, cluster: str) -> str:
        return f"{cluster}-{self.key}"

    @property
    def bought_as(self) -> GpuCapacity:
        return self.capacity or ON_DEMAND

    @property
    def capacity_type(self) -> str | None:
        """The node group's capacityType as EKS spells it; None: not declared."""
        return self.capacity.eks_name if self.capacity else None

    @property
    def capacity_block(self) -> bool:
        return self.capacity is CAPACITY_BLOCK

    def vcpu_quota(self) -> ServiceQuota | None:
        """The quota its nodes' vCPUs count against (infra/quota.py); None where they count
        against none, or against one of a family the catalog does not list."""
        return self.bought_as.vcpu_quota(self.instance_type) if self.counts_vcpu_quota else None

    @property
    def placement_group(self) -> bool:
        """A reservation made outside the group may not serve launches into a new placement group."""
        return self.efa and self.reservation is None

    def scaling(self) -> dict[str, int]:
        """The scaling block. An autoscaled group: from zero up to its nodes (EKS requires
        max >= 1, so 0 nodes keep a cap of 1 that no pod asks for), declaring a desired size of
        0, which an update sends only as `scaling_update` allows."""
        if not self.autoscaled:
            return {"desired_size": self.nodes, "min_size": self.nodes, "max_size": self.nodes}
        return {"desired_size": 0, "min_size": 0, "max_size": max(self.nodes, 1)}

    def scaling_update(self, live: LiveScaling | None, cluster: str) -> tuple[str, ...]:
        """The `ignoreChanges` of an autoscaled group, whose size cluster-autoscaler owns; raises
        ConfigError, before any resource, where no safe update exists.

        The aws provider updates a node group in two steps (terraform-provider-aws
        internal/service/eks/node_group.go, resourceNodeGroupUpdate): a launch-template or
        version change first (UpdateNodegroupVersion, then a wait as long as the roll, up to the
        60-minute update timeout), then, only if `scaling_config` differs from the state,
        UpdateNodegroupConfig with the whole block (expandNodegroupScalingConfig always sets the
        desired size). A desired size read at the program's start is stale by the time it is sent
        after a roll: a run that ended meanwhile would get idle GPU nodes started again, one that
        started would lose its nodes. So the desired size is never what changes the block: while
        the maximum stays, it is ignored and the provider sends no scaling at all; a new maximum
        must be sent, and goes out with the declared 0 only while the group is at 0 nodes.
        What remains: a run that starts between the program's start and that send (not this
        update's own RayJob, which waits for the node group), and a maximum changed outside
        Pulumi (the state's desired size goes with it)."""
        max_size = self.scaling()["max_size"]
        if live is None or live.max == max_size:
            return () if live is None else (DESIRED_SIZE,)
        if live.desired > 0:
            raise ConfigError([
                f"{self.count_key}: the node group {self.name(cluster)} holds {live.desired} "
                f"node(s) now; a new maximum ({live.max} -> {max_size}) sends the group's whole "
                "scaling configuration, whose node count would be stale by then. Change "
                f"{self.count_key} once the group is at 0 nodes (about 2 minutes after a run "
                f"ends), or end the run first: {END_A_RUN}"])
        return ()

    def autoscaler_tags(self) -> dict[str, str]:
        """What cluster-autoscaler cannot know about an EFA node before one exists: its EFA devices."""
        if not self.efa:
            return {}
        return {f"{NODE_TEMPLATE_RESOURCE_TAG}{EFA_RESOURCE}": str(self.facts.efa_interfaces)}


def node_groups(cfg: StackConfig) -> tuple[NodeGroupSpec, ...]:
    """The system group (KubeRay operator, Ray head, CoreDNS: fixed size, both zones) and the EFA
    GPU group (the run's workers: tainted, one zone, scaled from zero by cluster-autoscaler up to
    `gpuNodeCount`; on-demand or, with gpuCapacityType spot, Spot Instances: the system group,
    where the Ray head runs, stays on-demand). GPU nodes count against a vCPU quota only when a
    run is deployed and they do not launch into a reservation (infra/quota.py).

    Auto repair: the GPU group's per gpuNodeAutoRepair; the system group's always. Its node hosts
    cluster-autoscaler, the KubeRay operator, CoreDNS and the Ray head: EKS replaces it only after
    30 minutes of a failed condition (kubelet Ready, the agent's kernel, network or runtime
    checks; a NotReady node's pods Kubernetes evicts after 5 minutes), and without
    cluster-autoscaler an idle GPU node would bill until someone noticed. A replacement that does
    come mid-run ends that run's head; the run resumes from its checkpoint when resubmitted."""
    system = NodeGroupSpec(
        key="system", count_key="systemNodeCount", instance_type=cfg.system_instance_type,
        facts=cfg.system, nodes=cfg.system_node_count, ami_type="AL2023_x86_64_STANDARD",
        labels=SYSTEM_LABELS, taints=(), root=SYSTEM_ROOT, zones=2, autoscaled=False,
        auto_repair=True)
    gpu = NodeGroupSpec(
        key="gpu", count_key="gpuNodeCount", instance_type=cfg.gpu_instance_type, facts=cfg.gpu,
        nodes=cfg.gpu_node_count, ami_type="AL2023_x86_64_NVIDIA",
        labels=gpu_node_labels(cfg.gpu.accelerator), taints=(GPU_TAINT,),
        root=gpu_root(cfg.root_volume_gib), zones=1, autoscaled=True, efa=True,
        counts_vcpu_quota=bool(cfg.run_job and cfg.gpu_node_count and not cfg.reserved),
        reservation=cfg.reserved, capacity=cfg.gpu_capacity, auto_repair=cfg.gpu_node_auto_repair)
    return system, gpu


def launch_template_args(group: NodeGroupSpec, tags: Mapping[str, str],
                         placement_group: Input[str] | None = None,
                         security_group_id: Input[str] | None = None) -> dict:
    """What a node's launch template sets: IMDSv2 with hop limit 1, so pods cannot reach the node
    role's credentials (they use Pod Identity, which needs no metadata service), an encrypted
    gp3 root volume sized for image pulls, and nodeadm's FastImagePull gate where the instance
    type honours it (infra/root_volumes.py, infra/user_data.py). An EFA group's also: its EFA
    interfaces with the EKS-managed cluster security group (`security_group_id`: all traffic
    to and from itself), its placement group, its reservation; a Capacity Block names its
    instance type here only (EKS user guide ml/capacity-blocks-mng). What it launches carries
    the stack's tags: a node group's tags "do not propagate to any other resources associated
    with the node group, such as the Amazon EC2 instances" (EKS API reference, CreateNodegroup)."""
    args = {
        "metadata_options": {"http_endpoint": "enabled", "http_tokens": "required",
                             "http_put_response_hop_limit": 1},
        "block_device_mappings": [{"device_name": "/dev/xvda", "ebs": group.root.ebs()}],
        "tags": dict(tags),
    }
    if tags:  # a stack without tags has nothing to put there
        args["tag_specifications"] = [{"resource_type": kind, "tags": dict(tags)}
                                      for kind in LAUNCHED_RESOURCE_TYPES]
    user_data = launch_template_user_data(group.facts)
    if user_data is not None:
        args["user_data"] = user_data
    if group.efa:
        args["network_interfaces"] = efa_network_interfaces(group.facts.efa_interfaces,
                                                            security_group_id)
    if placement_group is not None:
        args["placement"] = {"group_name": placement_group}
    if group.reservation:
        args["capacity_reservation_specification"] = {"capacity_reservation_target": {
            "capacity_reservation_id": group.reservation.id}}
    if group.capacity_block:
        args["instance_market_options"] = {"market_type": "capacity-block"}
        args["instance_type"] = group.instance_type
    return args


def efa_network_interfaces(count: int, security_group_id: Input[str] | None) -> list[dict]:
    """One EFA interface per network card, as many as the pods request (p5.48xlarge: 32): the
    EC2 user guide (efa-acc-inst-types, "EFA configuration for P5") puts the primary on network
    card 0 / device index 0 and each further one on the next network card with device index 1.
    Every EFA carries the security group that allows all traffic to and from itself (efa-start)."""
    return [{"device_index": 0 if card == 0 else 1, "network_card_index": card,
             "interface_type": "efa", "security_groups": [security_group_id],
             "delete_on_termination": "true"} for card in range(count)]
