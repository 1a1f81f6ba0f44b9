"""The mocks that answer the Pulumi program as the engine and AWS would, recording every resource
and invoke it asks for (tests/infra/harness.py runs the program under them).

They answer across runs: a run may start from the state a
previous run left (`RecordingMocks(..., prior=previous)`): stack outputs, `pulumi.Stash` values,
the clusters, access entries and node groups that exist. `preview=True` runs it as
`pulumi preview` does: nothing is created, computed outputs stay unknown."""

from __future__ import annotations

import json
from dataclasses import dataclass

import grpc
import pulumi

from infra.access import principal_key
from tests.stack.stacks import PROJECT

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


class RecordingMocks(pulumi.runtime.Mocks):
    """Outputs echo the inputs plus what the program reads back; invokes answer in camelCase,
    as the real providers do. `offering` sets which zones offer the GPU instance type (every zone,
    Local Zones included, offers the others). `prior`: the mocks of the previous run, whose
    state (the engine's and AWS's) this run starts from."""

    def __init__(self, region: str, offering: list[str] | None = None,
                 deployer: str = "arn:aws:sts::123456789012:assumed-role/deployer/alice",
                 role_path: str = "/", preview: bool = False,
                 prior: "RecordingMocks | None" = None):
        self.region = region
        self.deployer = deployer  # the caller identity: an assumed-role session by default
        self.role_path = role_path  # the deployer role's IAM path, e.g. an SSO role's
        self.preview = preview  # `pulumi preview`: nothing is created, computed outputs unknown
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
        # State a run leaves for the next one. The engine: this stack's outputs (what a
        # StackReference to it reads; {} on the first update) and each Stash's kept value. AWS:
        # clusters (name -> access entries, principal ARN -> tags), the principals of the
        # entries the stack itself declared, and node groups' scaling ((cluster, group) -> dict).
        self.urns: set[str] = set(prior.urns) if prior else set()  # resources in the state
        self.previous_outputs: dict = dict(prior.exports) if prior and not prior.preview else {}
        self.stashes: dict[str, object] = dict(prior.stashes) if prior else {}
        self.clusters: dict[str, dict[str, dict]] = (
            {c: dict(e) for c, e in prior.clusters.items()} if prior else {"shared-gpu": {}})
        self.own_entries: dict[str, set[str]] = dict(prior.own_entries) if prior else {}
        self.scaling: dict[tuple[str, str], dict] = (
            {k: dict(v) for k, v in prior.scaling.items()} if prior else {})

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(Recorded(args.typ, args.name, dict(args.inputs)))
        # Echo inputs, minus references to other resources (echoing them would make the SDK
        # rehydrate those resources, which mocks cannot serve).
        outputs = {k: v for k, v in args.inputs.items() if not _has_resource(v)}
        if args.typ.startswith("aws:"):
            outputs.setdefault("name", args.name)  # auto-naming (Check: known in a preview too)
        if args.typ == "pulumi:pulumi:StackReference":
            outputs.update(self._stack_reference(args.inputs["name"]))
        if args.typ == "pulumi:index:Stash":
            # The engine's builtin provider (pkg/resource/deploy/builtins.go): Create, preview
            # or not, sets output = input; Update keeps the old output. Read keeps the state.
            outputs["output"] = self.stashes.get(args.name, args.inputs.get("input"))
            if not self.preview:
                self.stashes[args.name] = outputs["output"]
            return f"{args.name}-id", outputs
        if self.preview:  # a create in a preview: the provider computes nothing yet
            return None, outputs
        if args.typ == "eks:index:Cluster":
            self._create_cluster(args.inputs.get("name") or args.name, args.inputs)
            outputs["kubeconfigJson"] = json.dumps({"apiVersion": "v1", "kind": "Config"})
        if args.typ == "aws:eks/nodeGroup:NodeGroup":
            key = (args.inputs["clusterName"], args.inputs["nodeGroupName"])
            self.scaling[key] = dict(args.inputs["scalingConfig"])
        if args.typ == "aws:s3/bucket:Bucket":
            outputs.update(bucket=f"{args.name}-bucket", arn=f"arn:aws:s3:::{args.name}-bucket")
        if args.typ == "aws:iam/role:Role":
            outputs["arn"] = f"arn:aws:iam::123456789012:role/{args.name}"
        if args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            outputs["latestVersion"] = 1
        if args.typ == "aws:ecr/pullThroughCacheRule:PullThroughCacheRule":
            outputs["registryId"] = self.deployer.split(":")[4]  # the caller's account
        return f"{args.name}-id", outputs

    def _stack_reference(self, name: str) -> dict:
        """The builtin provider's answer (readStackReference): the named stack's outputs, {}
        for this stack on its first update; an unknown stack is an error."""
        own = f"organization/{PROJECT}/{pulumi.get_stack()}"
        if name != own:
            raise ValueError(f"mock engine: no stack named '{name}' found")
        return {"outputs": self.previous_outputs, "secretOutputNames": []}

    def _create_cluster(self, name: str, inputs: dict) -> None:
        """What pulumi-eks does in AWS (the component is opaque under mocks): the cluster, on
        its first update, with the creator's access entry (bootstrapClusterCreatorAdminPermissions,
        cluster.ts; no tags), then one AccessEntry per `accessEntries` item, deleting the
        stack's own entries it no longer declares. EKS refuses a second entry for a principal
        that has one: 409 ResourceInUseException."""
        if name not in self.clusters:
            creator = _session_context(self.deployer, self.role_path)["issuerArn"]
            self.clusters[name] = {creator: {}}
        entries, own = self.clusters[name], self.own_entries.get(name, set())
        wanted = {e["principalArn"]: e.get("tags") or {}
                  for e in (inputs.get("accessEntries") or {}).values()}
        for arn in own - set(wanted):
            del entries[arn]
        for arn, tags in wanted.items():
            taken = [a for a in entries if a not in own and principal_key(a) == principal_key(arn)]
            if taken:
                raise ValueError(f"creating EKS Access Entry ({name}:{arn}): "
                                 "ResourceInUseException: The specified access entry resource "
                                 f"is already in use on this cluster (entry of {taken[0]})")
            entries[arn] = tags
        self.own_entries[name] = set(wanted)

    def _iam_principal(self, token: str, name: str) -> dict:
        """iam:GetRole / iam:GetUser: the deployer's own role or user carries its path, any other
        principal of the account is at the root path."""
        kind = "role" if token.endswith("getRole") else "user"
        own = _session_context(self.deployer, self.role_path)["issuerArn"]
        arn = own if own.rsplit("/", 1)[1] == name and f":{kind}/" in own \
            else f"arn:aws:iam::{self.deployer.split(':')[4]}:{kind}/{name}"
        return {"arn": arn, "name": name, "userName": name, "id": name, "path": "/"}

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
        if args.token == "aws:index/getPartition:getPartition":  # of the provider's Region
            partition = _partition(pulumi.Config("aws").require("region"))
            return {"partition": partition, "id": partition,
                    "dnsSuffix": "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com",
                    "reverseDnsPrefix": "cn.com.amazonaws" if partition == "aws-cn"
                    else "com.amazonaws"}
        if args.token in ("aws:iam/getRole:getRole", "aws:iam/getUser:getUser"):
            return self._iam_principal(args.token, args.args.get("name") or args.args["userName"])
        if args.token == "aws:iam/getSessionContext:getSessionContext":
            return _session_context(args.args["arn"], self.role_path)
        if args.token == "aws:eks/getNodeGroups:getNodeGroups":
            return {"clusterName": args.args["clusterName"], "id": args.args["clusterName"],
                    "names": sorted(self.existing_node_groups)}
        if args.token == "aws:eks/getNodeGroup:getNodeGroup":
            return self._node_group(args.args["clusterName"], args.args["nodeGroupName"])
        if args.token == "aws:eks/getAddon:getAddon":
            if args.args["addonName"] not in self.existing_addons:
                # A failed invoke, with the text the aws provider gives DescribeAddon's
                # ResourceNotFoundException (terraform-provider-aws: retry.NotFoundError).
                return _not_found(f"reading EKS Add-On ({args.args['clusterName']}:"
                                  f"{args.args['addonName']})")
            return {"addonName": args.args["addonName"], "clusterName": args.args["clusterName"],
                    "addonVersion": "v1.3.10-eksbuild.3", "id": args.args["addonName"]}
        if args.token == "aws:servicequotas/getServiceQuota:getServiceQuota":
            return self._service_quota(args.args)
        if args.token == "aws:eks/getCluster:getCluster":
            if args.args["name"] not in self.clusters:
                return _not_found(f"reading EKS Cluster ({args.args['name']})")
            return {"name": args.args["name"], "endpoint": "https://eks.example",
                    "certificateAuthorities": [{"data": "Y2E="}],
                    "vpcConfig": {"clusterSecurityGroupId": "sg-eks-managed"}}
        if args.token == "aws:eks/getAccessEntry:getAccessEntry":
            cluster, arn = args.args["clusterName"], args.args["principalArn"]
            if arn not in self.clusters.get(cluster, {}):
                return _not_found(f"reading EKS Access Entry ({cluster}:{arn})")
            return {"clusterName": cluster, "principalArn": arn, "id": f"{cluster}:{arn}",
                    "tags": self.clusters[cluster][arn], "type": "STANDARD"}
        return {}

    def _node_group(self, cluster: str, group: str):
        """DescribeNodegroup: a group this program created (its scaling as last set), a group of
        the existing cluster `shared-gpu`, or ResourceNotFoundException."""
        found = {"clusterName": cluster, "id": f"{cluster}:{group}", "nodeGroupName": group}
        if (cluster, group) in self.scaling:
            return {**found, "scalingConfigs": [self.scaling[cluster, group]]}
        if cluster == "shared-gpu" and group in self.existing_node_groups:
            return {**found, **self.existing_node_groups[group]}
        return _not_found(f"reading EKS Node Group ({cluster}:{group})")

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


def _not_found(what: str) -> tuple[dict, list[tuple[str, str]]]:
    """A failed invoke with the text terraform-provider-aws gives a ResourceNotFoundException
    (retry.NotFoundError: "couldn't find resource")."""
    return {}, [("", f"{what}: couldn't find resource")]


def _partition(region: str) -> str:
    return {"cn": "aws-cn", "us-gov": "aws-us-gov"}.get(
        "us-gov" if region.startswith("us-gov-") else region.split("-")[0], "aws")


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
