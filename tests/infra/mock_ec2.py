"""The mocks' EC2 VPCs and subnets: what a stack's earlier updates created, read back as the aws
provider's data sources answer (RecordingMocks mixes this in).

- aws.ec2.get_vpcs / get_subnets run DescribeVpcs / DescribeSubnets with the given filters and
  return the ids found: none is an empty list, not an error (terraform-provider-aws
  vpc_vpcs_data_source.go, vpc_subnets_data_source.go). Filters `tag:<key>`, `vpc-id` and
  `cidr-block` are matched as EC2 matches them.
- aws.ec2.get_subnet(id=...) describes one subnet (availabilityZone, cidrBlock, vpcId).
"""

from __future__ import annotations

import pulumi


def _matches(item: dict, filters: list[dict]) -> bool:
    for f in filters:
        name, values = f["name"], f["values"]
        value = (item["tags"].get(name.removeprefix("tag:")) if name.startswith("tag:")
                 else item.get({"vpc-id": "vpcId", "cidr-block": "cidrBlock"}[name]))
        if value not in values:
            return False
    return True


class Ec2Account:
    vpcs: dict[str, dict]  # id -> {"tags"}
    subnets: dict[str, dict]  # id -> {"tags", "vpcId", "cidrBlock", "availabilityZone"}

    def _init_ec2(self, prior: "Ec2Account | None") -> None:
        self.vpcs = dict(prior.vpcs) if prior else {}
        self.subnets = dict(prior.subnets) if prior else {}

    def ec2_resource(self, args: pulumi.runtime.MockResourceArgs, resource_id: str) -> None:
        """Keep a created VPC or subnet (its id is the one new_resource answers)."""
        if args.typ == "aws:ec2/vpc:Vpc":
            self.vpcs[resource_id] = {"tags": dict(args.inputs.get("tags") or {})}
        if args.typ == "aws:ec2/subnet:Subnet":
            self.subnets[resource_id] = {
                "tags": dict(args.inputs.get("tags") or {}), "vpcId": args.inputs["vpcId"],
                "cidrBlock": args.inputs["cidrBlock"],
                "availabilityZone": args.inputs["availabilityZone"]}

    def ec2_call(self, token: str, args: dict, region: str) -> dict | None:
        if token == "aws:ec2/getVpcs:getVpcs":
            ids = [i for i, v in self.vpcs.items() if _matches(v, args.get("filters") or [])]
            return {"ids": ids, "id": region}
        if token == "aws:ec2/getSubnets:getSubnets":
            ids = [i for i, s in self.subnets.items() if _matches(s, args.get("filters") or [])]
            return {"ids": ids, "id": region}
        if token == "aws:ec2/getSubnet:getSubnet":
            return {"id": args["id"], **{k: v for k, v in self.subnets[args["id"]].items()}}
        return None
