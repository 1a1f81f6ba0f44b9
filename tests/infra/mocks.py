"""Run the Pulumi program under mocks and record every resource and invoke it asks for."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import grpc
import pulumi

from stack import catalog
from tests.infra import release_server
from tests.stack.stacks import PROJECT, raw_config, stack_name

# What DescribeAvailabilityZones returns for an account, sorted by name as AWS sorts it: an
# opted-in Local Zone sorts before the regular zones, and zone names map to account-specific zone
# IDs (here us-east-1b is use1-az3, where EKS refuses control-plane subnets).
ZONE_DATA = {
    "us-west-2": [("us-west-2-lax-1a", "usw2-lax1-az1", "opted-in"),
                  ("us-west-2a", "usw2-az2", "opt-in-not-required"),
                  ("us-west-2b", "usw2-az1", "opt-in-not-required"),
                  ("us-west-2c", "usw2-az3", "opt-in-not-required"),
                  ("us-west-2d", "usw2-az4", "opt-in-not-required")],
    "us-east-1": [("us-east-1a", "use1-az6", "opt-in-not-required"),
                  ("us-east-1b", "use1-az3", "opt-in-not-required"),
                  ("us-east-1c", "use1-az1", "opt-in-not-required"),
                  ("us-east-1d", "use1-az2", "opt-in-not-required"),
                  ("us-east-1f", "use1-az5", "opt-in-not-required")],
}
# Service Quotas' EC2 On-Demand vCPU quotas (name, applied value) of the mock account: enough for
# every stack the tests deploy (up to 64 GPU nodes of 48 vCPUs), update surge included.
SERVICE_QUOTAS = {
    "L-1216C47A": ("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", 640.0),
    "L-DB2E81BA": ("Running On-Demand G and VT instances", 3072.0),
    "L-417A185B": ("Running On-Demand P instances", 3072.0),
}
# Their usage metric's Class dimension (AWS/Usage ResourceCount).
USAGE_CLASS = {"L-1216C47A": "Standard/OnDemand", "L-DB2E81BA": "G/OnDemand",
               "L-417A185B": "P/OnDemand"}
# Regular zones only (what most tests reason about).
ZONES = {region: [name for name, _, opt_in in zones if opt_in == "opt-in-not-required"]
         for region, zones in ZONE_DATA.items()}


class ProviderInvokeError(grpc.RpcError):
    """A provider's failed invoke as the engine answers it: a gRPC error whose details carry the
    provider's message (pulumi/pulumi source_eval.go Invoke: "invocation of <tok> returned an
    error: ..."); the SDK raises it in the program as a plain, catchable Exception
    (pulumi/runtime/invoke.py, grpc_error_to_exception)."""

    def __init__(self, details: str):
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return self._details


@dataclass
class Recorded:
    type: str
    name: str
    inputs: dict


class RecordingMonitor(pulumi.runtime.mocks.MockMonitor):
    """Also records each resource's declared dependencies (by name), for ordering checks."""

    def __init__(self, mocks: "RecordingMocks"):
        super().__init__(mocks)
        self.recorder = mocks

    def RegisterResource(self, request):
        self.recorder.depends[request.name] = {u.rsplit("::", 1)[1] for u in request.dependencies}
        self.recorder.parents[request.name] = request.parent.rsplit("::", 1)[1] if request.parent else None
        self.recorder.ignore_changes[request.name] = list(request.ignoreChanges)
        refs = [request.provider, *request.providers.values()]
        self.recorder.providers[request.name] = {r.split("::")[-2] for r in refs if r}  # URN::id
        self.recorder.options[request.name] = {
            "retainOnDelete": request.retainOnDelete,
            "deleteBeforeReplace": request.deleteBeforeReplace,
            "replaceOnChanges": list(request.replaceOnChanges)}
        return super().RegisterResource(request)


class RecordingMocks(pulumi.runtime.Mocks):
    """Outputs echo the inputs plus what the program reads back; invokes answer in camelCase,
    as the real providers do. `offering` sets which zones offer the GPU instance type (every zone,
    Local Zones included, offers the others)."""

    def __init__(self, region: str, offering: list[str] | None = None,
                 deployer: str = "arn:aws:sts::123456789012:assumed-role/deployer/alice",
                 role_path: str = "/"):
        self.region = region
        self.deployer = deployer  # the caller identity: an assumed-role session by default
        self.role_path = role_path  # the deployer role's IAM path, e.g. an SSO role's
        # This stack's outputs from its previous update, as a StackReference to it reads them
        # ({} on the first update of a new stack).
        self.previous_outputs: dict = {}
        self.offering = ZONES[region][1:] if offering is None else offering
        self.gpu_types = {"g6.12xlarge", "g6.48xlarge", "g6e.12xlarge", "p5.48xlarge"}
        self.resources: list[Recorded] = []
        self.calls: list[tuple[str, dict]] = []
        self.depends: dict[str, set[str]] = {}
        self.exports: dict = {}  # stack output -> resolved value
        self.secret_exports: set[str] = set()
        self.parents: dict[str, str | None] = {}
        self.ignore_changes: dict[str, list[str]] = {}
        # An existing cluster as EKS describes it: node groups with the labels and taints this
        # program's own would carry, and its add-ons.
        self.existing_node_groups = {
            "system": {"labels": {"role": "system"}, "taints": []},
            "gpu": {"labels": {"role": "gpu-worker", "nvidia.com/gpu.present": "true",
                               "vpc.amazonaws.com/efa.present": "true"},
                    "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]},
        }
        self.existing_addons = {"eks-pod-identity-agent", "coredns", "vpc-cni"}
        # Service Quotas: quota code -> (name, value); `quota_denied` answers AccessDenied.
        self.quotas = dict(SERVICE_QUOTAS)
        self.quota_denied = False
        self.options: dict[str, dict] = {}
        self.providers: dict[str, set[str]] = {}  # resource -> names of its explicit providers

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(Recorded(args.typ, args.name, dict(args.inputs)))
        # Echo inputs, minus references to other resources (echoing them would make the SDK
        # rehydrate those resources, which mocks cannot serve).
        outputs = {k: v for k, v in args.inputs.items() if not _has_resource(v)}
        if args.typ.startswith("aws:"):
            outputs.setdefault("name", args.name)  # auto-naming
        if args.typ == "pulumi:pulumi:StackReference":
            outputs.update(outputs=self.previous_outputs, secretOutputNames=[])
        if args.typ == "eks:index:Cluster":
            outputs["kubeconfigJson"] = json.dumps({"apiVersion": "v1", "kind": "Config"})
        if args.typ == "aws:s3/bucket:Bucket":
            outputs.update(bucket=f"{args.name}-bucket", arn=f"arn:aws:s3:::{args.name}-bucket")
        if args.typ == "aws:iam/role:Role":
            outputs["arn"] = f"arn:aws:iam::123456789012:role/{args.name}"
        if args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            outputs["latestVersion"] = 1
        if args.typ == "aws:ecr/pullThroughCacheRule:PullThroughCacheRule":
            outputs["registryId"] = self.deployer.split(":")[4]  # the caller's account
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.calls.append((args.token, dict(args.args)))
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            zones = _describe_zones(ZONE_DATA[self.region], args.args)
            return {"names": [z[0] for z in zones], "zoneIds": [z[1] for z in zones],
                    "id": self.region}
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            (instance_type,) = next(f["values"] for f in args.args["filters"]
                                    if f["name"] == "instance-type")
            zones = (self.offering if instance_type in self.gpu_types
                     else [z[0] for z in ZONE_DATA[self.region]])
            return {"locations": zones, "locationTypes": ["availability-zone"] * len(zones),
                    "instanceTypes": [instance_type] * len(zones), "id": self.region}
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            account = self.deployer.split(":")[4]
            return {"arn": self.deployer, "accountId": account, "userId": "AROAEXAMPLE:alice",
                    "id": account}
        if args.token == "aws:iam/getSessionContext:getSessionContext":
            return _session_context(args.args["arn"], self.role_path)
        if args.token == "aws:eks/getNodeGroups:getNodeGroups":
            return {"clusterName": args.args["clusterName"], "id": args.args["clusterName"],
                    "names": sorted(self.existing_node_groups)}
        if args.token == "aws:eks/getNodeGroup:getNodeGroup":
            group = self.existing_node_groups[args.args["nodeGroupName"]]
            return {"clusterName": args.args["clusterName"], "id": args.args["nodeGroupName"],
                    "nodeGroupName": args.args["nodeGroupName"], **group}
        if args.token == "aws:eks/getAddon:getAddon":
            if args.args["addonName"] not in self.existing_addons:
                # A failed invoke, with the text the aws provider gives DescribeAddon's
                # ResourceNotFoundException (terraform-provider-aws: retry.NotFoundError).
                return {}, [("", f"reading EKS Add-On ({args.args['clusterName']}:"
                                 f"{args.args['addonName']}): couldn't find resource")]
            return {"addonName": args.args["addonName"], "clusterName": args.args["clusterName"],
                    "addonVersion": "v1.3.10-eksbuild.3", "id": args.args["addonName"]}
        if args.token == "aws:servicequotas/getServiceQuota:getServiceQuota":
            return self._service_quota(args.args)
        if args.token == "aws:eks/getCluster:getCluster":
            return {"name": args.args["name"], "endpoint": "https://eks.example",
                    "certificateAuthorities": [{"data": "Y2E="}],
                    "vpcConfig": {"clusterSecurityGroupId": "sg-eks-managed"}}
        return {}

    def _service_quota(self, args: dict) -> dict:
        """GetAWSDefaultServiceQuota then GetServiceQuota, as the aws provider's data source
        calls them; a denied call fails the invoke as the engine does, with the provider's text."""
        service, code = args["serviceCode"], args["quotaCode"]
        if self.quota_denied:
            raise ProviderInvokeError(
                f"invocation of aws:servicequotas/getServiceQuota:getServiceQuota returned an "
                f"error: 1 error occurred:\n\t* getting "
                f"Default Service Quota for ({service}/{code}): operation error Service Quotas: "
                f"GetAWSDefaultServiceQuota, https response error StatusCode: 400, RequestID: "
                f"8c5ee7e2-0000-4000-8000-000000000000, api error AccessDeniedException: User: "
                f"{self.deployer} is not authorized to perform: "
                f"servicequotas:GetAWSDefaultServiceQuota because no identity-based policy allows "
                f"the servicequotas:GetAWSDefaultServiceQuota action")
        name, value = self.quotas[code]
        arn = f"arn:aws:servicequotas:{self.region}:{self.deployer.split(':')[4]}:{service}/{code}"
        return {"adjustable": True, "arn": arn, "defaultValue": 5.0 if code == "L-1216C47A" else 0.0,
                "globalQuota": False, "id": arn, "quotaCode": code, "quotaName": name,
                "region": self.region, "serviceCode": service,
                "serviceName": "Amazon Elastic Compute Cloud (Amazon EC2)", "value": value,
                "usageMetrics": [{"metricName": "ResourceCount", "metricNamespace": "AWS/Usage",
                                  "metricStatisticRecommendation": "Maximum",
                                  "metricDimensions": [{"class": USAGE_CLASS[code],
                                                        "resource": "vCPU", "service": "EC2",
                                                        "type": "Resource"}]}]}

    def depends_on(self, name: str, other: str) -> bool:
        """`name`'s registered dependencies reach `other`, directly or through the resources
        they depend on. A component's own `depends_on` is not followed: the engine gives a
        child only DeletedWith, Protect, RetainOnDelete and Provider from its parent (pulumi/pulumi
        pkg/resource/deploy/source_eval.go, inheritFromParent)."""
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            if other in self.depends.get(current, ()):
                return True
            todo.extend(self.depends.get(current, ()))
        return False

    def of_type(self, typ: str, name_part: str = "") -> list[Recorded]:
        return [r for r in self.resources if r.type == typ and name_part in r.name]

    def one(self, typ: str, name_part: str = "") -> Recorded:
        found = self.of_type(typ, name_part)
        assert len(found) == 1, (typ, name_part, [r.name for r in found])
        return found[0]


def _session_context(arn: str, role_path: str) -> dict:
    """iam.getSessionContext: an assumed-role ARN maps to its role (the provider looks the role up
    with iam:GetRole, so the issuer ARN carries the role's path, e.g.
    /aws-reserved/sso.amazonaws.com/ for an SSO role); any other ARN maps to itself."""
    partition, service, account, resource = arn.split(":")[1], arn.split(":")[2], \
        arn.split(":")[4], arn.split(":")[5]
    if service == "sts" and resource.startswith("assumed-role/"):
        _, role, session = resource.split("/", 2)
        return {"arn": arn, "issuerArn": f"arn:{partition}:iam::{account}:role{role_path}{role}",
                "issuerId": "AROAEXAMPLE", "issuerName": role, "sessionName": session, "id": arn}
    return {"arn": arn, "issuerArn": arn, "issuerId": "", "issuerName": "", "sessionName": "",
            "id": arn}


def _describe_zones(zones: list[tuple[str, str, str]], args: dict) -> list[tuple[str, str, str]]:
    """DescribeAvailabilityZones as the aws provider calls it: every filter it sends is applied
    (an unknown filter is an error, as EC2 answers), and the exclusions too."""
    fields = {"zone-name": 0, "zone-id": 1, "opt-in-status": 2}
    for f in args.get("filters") or []:
        if f["name"] not in fields:
            raise ValueError(f"mock DescribeAvailabilityZones: unsupported filter {f['name']}")
        zones = [z for z in zones if z[fields[f["name"]]] in f["values"]]
    if args.get("state") not in (None, "available"):
        zones = []
    return [z for z in zones if z[0] not in (args.get("excludeNames") or ())
            and z[1] not in (args.get("excludeZoneIds") or ())]


def _has_resource(value) -> bool:
    if isinstance(value, pulumi.Resource):
        return True
    if isinstance(value, dict):
        return any(_has_resource(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_resource(v) for v in value)
    return False


def run_program(stack_file: Path, overrides: dict[str, str] | None = None,
                offering: list[str] | None = None, secrets: dict[str, str] | None = None,
                mocks: RecordingMocks | None = None,
                aws_config: dict[str, str] | None = None,
                crd_url: str | None = None) -> RecordingMocks:
    """The real program (program.run) under mocks, with the stack file's config + overrides.
    KubeRay's CRDs come from the loopback release server (`crd_url`: another URL template)."""
    import program

    raw, region = raw_config(stack_file)
    raw.update(overrides or {})
    mocks = mocks or RecordingMocks(region, offering)
    # "organization": what a DIY (--local, S3) backend reports as the stack's organization.
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack_name(stack_file), preview=False,
                             monitor=RecordingMonitor(mocks), organization="organization")
    config = {f"{PROJECT}:{k}": v for k, v in raw.items()}
    config["aws:region"] = region
    config.update({f"aws:{k}": v for k, v in (aws_config or {}).items()})
    config.update({f"{PROJECT}:{k}": v for k, v in (secrets or {}).items()})
    pulumi.runtime.set_all_config(config, [f"{PROJECT}:{k}" for k in secrets or {}])

    exported: dict = {}

    async def resolve_exports():
        for key, value in exported.items():
            output = pulumi.Output.from_input(value)
            mocks.exports[key] = await output.future()
            if await output.is_secret():
                mocks.secret_exports.add(key)

    @pulumi.runtime.test
    def deploy():
        with mock.patch("pulumi.export", side_effect=exported.__setitem__):
            program.run()
        return pulumi.Output.from_input(asyncio.ensure_future(resolve_exports()))

    # Resource references among the inputs (node groups point at the cluster) stay URNs: the SDK
    # would otherwise rebuild those resources inside the mock monitor, on another event loop.
    with mock.patch("pulumi.runtime.rpc.get_resource_module", return_value=None), \
            mock.patch.object(catalog, "KUBERAY_CRD_URL", crd_url or release_server.crd_url()):
        deploy()
    return mocks
