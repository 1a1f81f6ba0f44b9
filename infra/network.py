"""VPC with public and private subnets in two zones, one NAT gateway, and the EKS subnet tags."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from stack.config import StackConfig
from infra.zones import REGULAR_ZONES_FILTER, choose_zones, keep_zones, subnet_cidrs

ZONE_COUNT = 2  # EKS needs control-plane subnets in two zones; the GPU group uses the first


def lookup_zones(cfg: StackConfig) -> list[str]:
    """The two zones, GPU zone first, from what this Region offers; raises NetworkError. Called
    before any resource is declared, so a Region without the GPU type builds nothing."""
    def offering(instance_type: str) -> list[str]:
        return list(aws.ec2.get_instance_type_offerings(
            location_type="availability-zone",
            filters=[{"name": "instance-type", "values": [instance_type]}]).locations)

    zones = aws.get_availability_zones(state="available", filters=[REGULAR_ZONES_FILTER])
    return choose_zones(cfg.gpu_availability_zone, dict(zip(zones.names, zones.zone_ids)),
                        offering(cfg.gpu_instance_type), offering(cfg.system_instance_type),
                        cfg.gpu_instance_type, cfg.system_instance_type)


def existing_zones(cfg: StackConfig) -> list[str] | None:
    """The zones of this stack's private subnets where its VPC exists already (GPU zone first, by
    the CIDRs Network gives them), else None. DescribeVpcs and DescribeSubnets with filters that
    match nothing answer an empty list, not an error (terraform-provider-aws
    vpc_vpcs_data_source.go and vpc_subnets_data_source.go set `ids` from what they found), so a
    fresh account reads None. The VPC is known by the Name and cluster tags Network gives it
    (cluster names are unique per account and Region)."""
    vpcs = aws.ec2.get_vpcs(filters=[
        {"name": "tag:Name", "values": [cfg.name]},
        {"name": f"tag:kubernetes.io/cluster/{cfg.name}", "values": ["shared"]}]).ids or []
    if len(vpcs) != 1:
        return None
    zones = []
    for cidr in subnet_cidrs(cfg.vpc_cidr, 2 * ZONE_COUNT)[ZONE_COUNT:]:
        ids = aws.ec2.get_subnets(filters=[{"name": "vpc-id", "values": vpcs},
                                           {"name": "cidr-block", "values": [cidr]}]).ids or []
        if len(ids) != 1:
            return None
        zones.append(aws.ec2.get_subnet(id=ids[0]).availability_zone)
    return zones


class Network(pulumi.ComponentResource):
    """Private subnets hold the nodes, the GPU zone's first: a one-zone node group (the GPU
    group) uses only that one (infra/node_groups.py NodeGroupSpec.zones).
    `chosen`: this run's zone choice (lookup_zones); the subnets go where the first deployment
    put them (keep_zones), which a pulumi.Stash holds in the stack's state. A Stash rather than
    a config value the first run would have to write (a program cannot): the engine's builtin
    provider sets its output to its input on create, preview included, and keeps the old output
    on every update and refresh (pkg/resource/deploy/builtins.go, Create/Update/Read of
    pulumi:index:Stash; pulumi 3.272.0's pulumi/stash.py), so it survives a failed update too.
    A stack deployed before the Stash existed stores the zones of the subnets it has
    (`existing`, existing_zones), not this run's choice: AWS's offerings may have changed since."""

    zones: pulumi.Output[list[str]]  # the two zones the subnets are in, the GPU zone first
    gpu_zone: pulumi.Output[str]  # the GPU group's one zone (the gpuAvailabilityZone output)
    vpc: aws.ec2.Vpc
    public_subnets: list[aws.ec2.Subnet]  # one per zone, in `zones` order: the NAT gateway's
    private_subnets: list[aws.ec2.Subnet]  # one per zone, in `zones` order: the nodes'

    def __init__(self, name: str, cfg: StackConfig, chosen: list[str],
                 existing: list[str] | None = None, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eksraytrain:infra:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        first = pulumi.Stash(f"{name}-zones", input=existing or chosen, opts=child).output
        self.zones = first.apply(lambda kept: keep_zones(kept, chosen, cfg.gpu_availability_zone))
        zone = [self.zones.apply(lambda zones, i=i: zones[i]) for i in range(ZONE_COUNT)]
        self.gpu_zone = zone[0]
        tags = {**cfg.tags, f"kubernetes.io/cluster/{cfg.name}": "shared"}
        self.vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=cfg.vpc_cidr, enable_dns_hostnames=True,
                               enable_dns_support=True, tags={**tags, "Name": cfg.name}, opts=child)
        cidrs = subnet_cidrs(cfg.vpc_cidr, 2 * ZONE_COUNT)
        self.public_subnets = [self._subnet(name, "public", i, zone[i], cidrs[i], tags,
                                            {"kubernetes.io/role/elb": "1"})
                               for i in range(ZONE_COUNT)]
        self.private_subnets = [self._subnet(name, "private", i, zone[i], cidrs[ZONE_COUNT + i],
                                             tags, {"kubernetes.io/role/internal-elb": "1"})
                                for i in range(ZONE_COUNT)]
        self._create_routes(name, cfg.region, tags)
        self.register_outputs({"vpc_id": self.vpc.id, "gpu_zone": self.gpu_zone})

    def _subnet(self, name: str, kind: str, i: int, zone: pulumi.Output[str], cidr: str,
                tags: dict, role_tag: dict) -> aws.ec2.Subnet:
        return aws.ec2.Subnet(
            f"{name}-{kind}-{i}", vpc_id=self.vpc.id, availability_zone=zone, cidr_block=cidr,
            map_public_ip_on_launch=kind == "public", tags={**tags, **role_tag,
                                                             "Name": zone.apply(
                                                                 lambda z: f"{name}-{kind}-{z}")},
            opts=pulumi.ResourceOptions(parent=self))

    def _create_routes(self, name: str, region: str, tags: dict) -> None:
        child = pulumi.ResourceOptions(parent=self)
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=self.vpc.id, tags=tags, opts=child)
        public_rt = aws.ec2.RouteTable(f"{name}-public-rt", vpc_id=self.vpc.id, tags=tags, routes=[
            {"cidr_block": "0.0.0.0/0", "gateway_id": igw.id}], opts=child)
        # One NAT gateway for all private subnets: a cost choice (a zone outage cuts egress).
        eip = aws.ec2.Eip(f"{name}-nat-ip", domain="vpc", tags=tags, opts=child)
        nat = aws.ec2.NatGateway(f"{name}-nat", allocation_id=eip.id,
                                 subnet_id=self.public_subnets[0].id, tags=tags,
                                 opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]))
        private_rt = aws.ec2.RouteTable(f"{name}-private-rt", vpc_id=self.vpc.id, tags=tags, routes=[
            {"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}], opts=child)
        for kind, subnets, table in (("public", self.public_subnets, public_rt),
                                     ("private", self.private_subnets, private_rt)):
            for i, subnet in enumerate(subnets):
                aws.ec2.RouteTableAssociation(f"{name}-{kind}-rt-{i}", subnet_id=subnet.id,
                                              route_table_id=table.id, opts=child)
        # Checkpoints, and the layers of images in *private* ECR (stored in S3: ECR user guide,
        # vpc-endpoints), reach S3 without the NAT gateway: no per-GB NAT processing charge and
        # no NAT throughput ceiling. A gateway endpoint itself costs nothing. The Ray image comes
        # from ECR Public (public.ecr.aws), which VPC endpoints do not serve (same page): its
        # pulls still cross the NAT gateway (docs/costs.md, "The image path").
        aws.ec2.VpcEndpoint(f"{name}-s3", vpc_id=self.vpc.id, service_name=f"com.amazonaws.{region}.s3",
                            vpc_endpoint_type="Gateway", route_table_ids=[private_rt.id], tags=tags,
                            opts=child)
