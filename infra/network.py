"""VPC with public and private subnets in two zones, one NAT gateway, and the EKS subnet tags."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from stack.config import StackConfig
from infra.zones import REGULAR_ZONES_FILTER, choose_zones, subnet_cidrs


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


class Network(pulumi.ComponentResource):
    """Private subnets hold the nodes; the GPU node group uses only `gpu_subnet_id` (one zone)."""

    def __init__(self, name: str, cfg: StackConfig, zones: list[str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("eksraytrain:infra:Network", name, None, opts)
        self.zones = zones
        self.gpu_zone = zones[0]
        child = pulumi.ResourceOptions(parent=self)
        tags = {**cfg.tags, f"kubernetes.io/cluster/{cfg.name}": "shared"}
        self.vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=cfg.vpc_cidr, enable_dns_hostnames=True,
                               enable_dns_support=True, tags={**tags, "Name": cfg.name}, opts=child)
        cidrs = subnet_cidrs(cfg.vpc_cidr, 2 * len(self.zones))
        self.public_subnets = [self._subnet(name, "public", i, zone, cidrs[i], tags,
                                            {"kubernetes.io/role/elb": "1"})
                               for i, zone in enumerate(self.zones)]
        self.private_subnets = [self._subnet(name, "private", i, zone, cidrs[len(self.zones) + i],
                                             tags, {"kubernetes.io/role/internal-elb": "1"})
                                for i, zone in enumerate(self.zones)]
        self._create_routes(name, cfg.region, tags)
        self.gpu_subnet_id = self.private_subnets[0].id
        self.register_outputs({"vpc_id": self.vpc.id, "gpu_zone": self.gpu_zone})

    def _subnet(self, name: str, kind: str, i: int, zone: str, cidr: str, tags: dict,
                role_tag: dict) -> aws.ec2.Subnet:
        return aws.ec2.Subnet(
            f"{name}-{kind}-{i}", vpc_id=self.vpc.id, availability_zone=zone, cidr_block=cidr,
            map_public_ip_on_launch=kind == "public", tags={**tags, **role_tag,
                                                             "Name": f"{name}-{kind}-{zone}"},
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
        # Checkpoints and image layers (ECR serves layers from S3) reach S3 without the NAT
        # gateway: no per-GB NAT processing charge and no NAT throughput ceiling. A gateway
        # endpoint itself costs nothing.
        aws.ec2.VpcEndpoint(f"{name}-s3", vpc_id=self.vpc.id, service_name=f"com.amazonaws.{region}.s3",
                            vpc_endpoint_type="Gateway", route_table_ids=[private_rt.id], tags=tags,
                            opts=child)
