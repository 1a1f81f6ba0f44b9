"""The mocks that answer the Pulumi program as the engine and AWS would, recording every resource
and invoke it asks for (tests/infra/harness.py runs the program under them).

They answer across runs: a run may start from the state a
previous run left (`RecordingMocks(..., prior=previous)`): stack outputs, `pulumi.Stash` values,
the clusters, access entries and node groups that exist (tests/infra/mock_eks.py). `preview=True`
runs it as `pulumi preview` does: nothing is created, computed outputs stay unknown. The engine
is a CLI of `cli_version` (None: one without the RequirePulumiVersion RPC) that gates invokes on
their dependencies (`gates_invokes`, as from 3.256.0) or, as older ones, does not."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

import pulumi

from tests.infra.mock_ec2 import Ec2Account
from tests.infra.mock_eks import EksAccount, ProviderInvokeError
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
    "L-3819A6DF": ("All G and VT Spot Instance Requests", 3072.0),
    "L-7212CCBC": ("All P Spot Instance Requests", 3072.0),
}
# Their usage metric's Class dimension (AWS/Usage ResourceCount).
USAGE_CLASS = {"L-1216C47A": "Standard/OnDemand", "L-DB2E81BA": "G/OnDemand",
               "L-417A185B": "P/OnDemand", "L-3819A6DF": "G/Spot", "L-7212CCBC": "P/Spot"}
# Regular zones only (what most tests reason about).
ZONES = {region: [name for name, _, opt_in in zones if opt_in == "opt-in-not-required"]
         for region, zones in ZONE_DATA.items()}


@dataclass
class Recorded:
    type: str
    name: str
    inputs: dict


class RecordingMocks(EksAccount, Ec2Account, pulumi.runtime.Mocks):
    """Outputs echo the inputs plus what the program reads back; invokes answer in camelCase,
    as the real providers do. `offering` sets which zones offer the GPU instance type (every zone,
    Local Zones included, offers the others). `prior`: the mocks of the previous run, whose
    state (the engine's and AWS's) this run starts from."""

    def __init__(self, region: str, offering: list[str] | None = None,
                 deployer: str = "arn:aws:sts::123456789012:assumed-role/deployer/alice",
                 role_path: str = "/", preview: bool = False,
                 prior: "RecordingMocks | None" = None, gates_invokes: bool = True,
                 cli_version: str | None = "3.272.0"):
        self.region = region
        self.gates_invokes, self.cli_version = gates_invokes, cli_version
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
        self.secret_inputs: dict[str, set[str]] = {}  # resource -> its secret input properties
        # The URN of the resource this thread registers (harness.py): the SDK registers from a
        # pool of threads, each RegisterResource calling new_resource on its own thread.
        self.registering = threading.local()
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
        # what EksAccount keeps.
        self.urns: set[str] = set(prior.urns) if prior else set()  # resources in the state
        self.previous_outputs: dict = dict(prior.exports) if prior and not prior.preview else {}
        self.stashes: dict[str, object] = dict(prior.stashes) if prior else {}
        self._init_eks(prior)
        self._init_ec2(prior)

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
        if args.resource_id and args.typ == "aws:eks/accessEntry:AccessEntry":
            return self.read_access_entry(args.resource_id)  # a Read runs in a preview too
        if not self.preview:  # a create in a preview: the provider computes nothing yet
            self.eks_resource(args, outputs)
        if args.typ == "eks:index:Cluster":  # an existing cluster's child is in the state
            self.eks_cluster_output(args.inputs.get("name") or args.name, self.registering.urn,
                                    outputs)
        if self.preview:
            return None, outputs
        if args.typ == "aws:s3/bucket:Bucket":
            outputs.update(bucket=f"{args.name}-bucket", arn=f"arn:aws:s3:::{args.name}-bucket")
        if args.typ == "aws:iam/role:Role":
            outputs["arn"] = f"arn:aws:iam::123456789012:role/{args.name}"
        if args.typ == "aws:ecr/pullThroughCacheRule:PullThroughCacheRule":
            outputs["registryId"] = self.deployer.split(":")[4]  # the caller's account
        if _kubernetes_object(args.typ):  # the API server gives every object it creates a uid
            outputs["metadata"] = {**(outputs.get("metadata") or {}),
                                   "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, args.name))}
        self.ec2_resource(args, f"{args.name}-id")
        return f"{args.name}-id", outputs

    def _stack_reference(self, name: str) -> dict:
        """The builtin provider's answer (readStackReference): the named stack's outputs, {}
        for this stack on its first update; an unknown stack is an error."""
        own = f"organization/{PROJECT}/{pulumi.get_stack()}"
        if name != own:
            raise ValueError(f"mock engine: no stack named '{name}' found")
        return {"outputs": self.previous_outputs, "secretOutputNames": []}

    def deployer_issuer(self) -> str:
        """The deployer's IAM role or user, as EKS records the cluster's creator."""
        return _session_context(self.deployer, self.role_path)["issuerArn"]

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
        eks_answer = self.eks_call(args.token, args.args)
        if eks_answer is not None:
            return eks_answer
        ec2_answer = self.ec2_call(args.token, args.args, self.region)
        if ec2_answer is not None:
            return ec2_answer
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
        if args.token == "aws:servicequotas/getServiceQuota:getServiceQuota":
            return self._service_quota(args.args)
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


def _kubernetes_object(typ: str) -> bool:
    """A resource the Kubernetes provider creates as one API object (not a Helm release, a
    group of manifests or the provider itself)."""
    return typ.startswith("kubernetes:") and not typ.startswith(
        ("kubernetes:helm.sh", "kubernetes:yaml", "pulumi:providers"))
