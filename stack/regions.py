"""Which Region can run the stack: for its GPU instance type, every Region of the account that
offers it, the zones there, the account's On-Demand and Spot vCPU quotas for its family, the
on-demand price where stack/catalog.py has one, and the stack keys to set. Read with boto3 and the
deployer's credentials, before any `pulumi up` (no Pulumi here):

    python -m stack.regions --stack dev
    python -m stack.regions --instance-type p5.48xlarge --nodes 1

- Regions: ec2 DescribeRegions, which by default lists only the Regions enabled for the account
  (EC2 API reference, DescribeRegions, AllRegions: "Indicates whether to display all Regions,
  including Regions that are disabled for your account").
- Zones: ec2 DescribeInstanceTypeOfferings with LocationType=availability-zone, filtered on
  instance-type, in each Region (EC2 API reference, DescribeInstanceTypeOfferings).
- Quotas: Service Quotas GetServiceQuota (service code `ec2`) with the codes of the stack's
  catalog (catalog.ON_DEMAND / catalog.SPOT .vcpu_quota, as infra/quota.py reads them). A quota
  never changed for the account has no applied value (NoSuchResourceException): then its AWS
  default (GetAWSDefaultServiceQuota), as the aws provider's service_quota data source does.
- Bad input or no access: one line and exit 2 (no credentials, access denied, unknown type)."""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from stack import catalog
from stack.parse import as_config_string, declared
from training.errors import InputError
from training.settings import closest

REPO = Path(__file__).resolve().parent.parent
SERVICE_CODE = "ec2"
HOME_REGION = "us-east-1"  # asks DescribeRegions where neither the stack nor --region names one
DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure",
          "UnrecognizedClientException", "InvalidClientTokenId", "ExpiredToken"}
Client = Callable[[str, str], Any]  # (service, region) -> a boto3 client


class RegionsError(InputError):
    """Why the Regions cannot be listed, in one line."""


@dataclass(frozen=True)
class Target:
    """What the stack asks for: its GPU nodes, how they are bought, and where it deploys now."""

    instance_type: str
    nodes: int
    capacity: catalog.GpuCapacity
    region: str | None = None
    zone: str | None = None
    stack: str | None = None

    @property
    def vcpus(self) -> int:
        return self.nodes * catalog.INSTANCES[self.instance_type].vcpus


@dataclass(frozen=True)
class RegionOffer:
    """One Region offering the type: its zones, the vCPU quotas (None: the catalog lists no quota
    for the family), the on-demand USD per hour (None: the catalog has no price there)."""

    region: str
    zones: tuple[str, ...]
    on_demand: float | None
    spot: float | None
    price: float | None


def target_from_stack(stack: str, repo: Path = REPO) -> Target:
    """The stack file's GPU keys over Pulumi.yaml's defaults, as the Pulumi CLI merges them."""
    path = repo / f"Pulumi.{stack}.yaml"
    if not path.exists():
        have = ", ".join(sorted(p.name for p in repo.glob("Pulumi.*.yaml")))
        raise RegionsError(f"no stack file {path.name} (have {have})")
    config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    project = yaml.safe_load((repo / "Pulumi.yaml").read_text())["name"]
    raw = dict(declared())
    raw.update({k.partition(":")[2]: as_config_string(v) for k, v in config.items()
                if k.partition(":")[0] == project})
    try:
        nodes = int(raw["gpuNodeCount"])
    except ValueError:
        raise RegionsError(f"gpuNodeCount: cannot read {raw['gpuNodeCount']!r}") from None
    return target(raw["gpuInstanceType"], nodes, raw["gpuCapacityType"],
                  str(config.get("aws:region") or "") or None,
                  raw.get("gpuAvailabilityZone") or None, stack)


def target(instance_type: str, nodes: int, capacity: str, region: str | None = None,
           zone: str | None = None, stack: str | None = None) -> Target:
    """A Target whose type and capacity the catalog knows; RegionsError naming the closest."""
    if instance_type not in catalog.INSTANCES:
        known = list(catalog.INSTANCES)
        raise RegionsError(f"gpuInstanceType: unknown {instance_type!r}"
                           f"{closest(instance_type, known)}; stack/catalog.py knows "
                           f"{', '.join(known)}")
    if capacity not in catalog.CAPACITY_TYPES:
        known = list(catalog.CAPACITY_TYPES)
        raise RegionsError(f"gpuCapacityType: unknown {capacity!r}{closest(capacity, known)}; "
                           f"use one of {', '.join(known)}")
    return Target(instance_type, nodes, catalog.CAPACITY_TYPES[capacity], region, zone, stack)


def zones_offering(ec2: Any, instance_type: str) -> tuple[str, ...]:
    """The Region's zones that offer the type, sorted."""
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": [instance_type]}])
    return tuple(sorted(o["Location"] for page in pages for o in page["InstanceTypeOfferings"]))


def quota_value(quotas: Any, quota: catalog.ServiceQuota | None) -> float | None:
    """The quota's applied value, else its AWS default; None where the catalog lists none."""
    if quota is None:
        return None
    try:
        got = quotas.get_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=quota.code)
    except quotas.exceptions.NoSuchResourceException:
        got = quotas.get_aws_default_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=quota.code)
    return float(got["Quota"]["Value"])


def region_offer(client: Client, region: str, instance_type: str) -> RegionOffer | None:
    """The Region's offer, or None where no zone of it offers the type."""
    zones = zones_offering(client("ec2", region), instance_type)
    if not zones:
        return None
    quotas = client("service-quotas", region)
    price = catalog.PRICES_USD_PER_HOUR.get(region, {}).get(instance_type)
    return RegionOffer(region, zones,
                       quota_value(quotas, catalog.ON_DEMAND.vcpu_quota(instance_type)),
                       quota_value(quotas, catalog.SPOT.vcpu_quota(instance_type)), price)


def offers(client: Client, want: Target, regions: list[str] | None = None) -> list[RegionOffer]:
    """Every enabled Region (or those named) that offers the type, in Region order; read in
    parallel, one thread per Region at a time of eight."""
    if regions is None:
        listed = client("ec2", want.region or HOME_REGION).describe_regions()["Regions"]
        regions = sorted(r["RegionName"] for r in listed)
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = pool.map(lambda r: region_offer(client, r, want.instance_type), regions)
        return [o for o in found if o is not None]


def _quota_text(value: float | None, need: int, mine: bool) -> str:
    if value is None:
        return "no quota listed"
    mark = (" enough" if value >= need else f" < {need} needed") if mine else ""
    return f"{value:g} vCPUs{mark}"


def keys(want: Target, offer: RegionOffer) -> list[str]:
    """The `pulumi config set` commands that point the stack at this Region."""
    stack = f" --stack {want.stack}" if want.stack else ""
    out = [f"pulumi config set aws:region {offer.region}{stack}",
           f"pulumi config set gpuInstanceType {want.instance_type}{stack}"]
    if want.zone and want.zone not in offer.zones:
        out.append(f"pulumi config set gpuAvailabilityZone {offer.zones[0]}{stack}")
    return out


def report(want: Target, found: list[RegionOffer]) -> list[str]:
    """Lines for the terminal: one block per Region, those whose quota holds the nodes first."""
    facts = catalog.INSTANCES[want.instance_type]
    head = (f"{want.instance_type} ({facts.vcpus} vCPUs): {want.nodes} {want.capacity.name} "
            f"node(s) need {want.vcpus} vCPUs; offered in {len(found)} Region(s)")
    if not found:
        return [head]
    spot = want.capacity is catalog.SPOT

    def holds(o: RegionOffer) -> bool:
        value = o.spot if spot else o.on_demand
        return value is not None and value >= want.vcpus

    lines = [head]
    for o in sorted(found, key=lambda o: not holds(o)):
        price = f"{o.price:g} USD/h on-demand" if o.price is not None else "price not in catalog"
        lines.append(f"{o.region}{' (current)' if o.region == want.region else ''}: "
                     f"zones {' '.join(o.zones)}; on-demand quota "
                     f"{_quota_text(o.on_demand, want.vcpus, not spot)}; spot quota "
                     f"{_quota_text(o.spot, want.vcpus, spot)}; {price}")
        lines.extend(f"  {k}" for k in keys(want, o))
    return lines


def _denied_or_raise(error: Exception) -> str:
    """The one line for a credentials or access problem; re-raises anything else."""
    from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

    if isinstance(error, (NoCredentialsError, PartialCredentialsError)):
        return f"no AWS credentials ({error}); set AWS_PROFILE or run `aws configure`"
    if isinstance(error, ClientError) and error.response["Error"]["Code"] in DENIED:
        return (f"access denied: {error}; the deployer needs ec2:DescribeRegions, "
                f"ec2:DescribeInstanceTypeOfferings, servicequotas:GetServiceQuota and "
                f"servicequotas:GetAWSDefaultServiceQuota")
    raise error


def boto3_client(service: str, region: str) -> Any:
    import boto3  # lazily: `pulumi up` never needs it, and --help is instant

    return boto3.client(service, region_name=region)


def main(argv: list[str] | None = None, client: Client = boto3_client) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack.regions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", help="read gpuInstanceType, gpuNodeCount and "
                                        "gpuCapacityType from Pulumi.<stack>.yaml")
    parser.add_argument("--instance-type", help="instead of the stack's gpuInstanceType")
    parser.add_argument("--nodes", type=int, help="instead of the stack's gpuNodeCount (default 1)")
    parser.add_argument("--regions", help="comma-separated Regions instead of all enabled ones")
    args = parser.parse_args(argv)
    try:
        if args.stack:
            want = target_from_stack(args.stack)
        elif args.instance_type:
            want = target(args.instance_type, 1, catalog.ON_DEMAND.name)
        else:
            raise RegionsError("give --stack NAME or --instance-type TYPE")
        if args.instance_type or args.nodes is not None:
            want = target(args.instance_type or want.instance_type,
                          want.nodes if args.nodes is None else args.nodes, want.capacity.name,
                          want.region, want.zone, want.stack)
        regions = args.regions.split(",") if args.regions else None
        try:
            found = offers(client, want, regions)
        except Exception as error:
            raise RegionsError(_denied_or_raise(error)) from None
    except RegionsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(report(want, found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
