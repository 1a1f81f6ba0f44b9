"""Run the Pulumi program under mocks and record every resource and invoke it asks for."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pulumi

from tests.stack.stacks import PROJECT, raw_config, stack_name

ZONES = {"us-west-2": ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"],
         "us-east-1": ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"]}


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
        self.recorder.options[request.name] = {
            "deleteBeforeReplace": request.deleteBeforeReplace,
            "replaceOnChanges": list(request.replaceOnChanges)}
        return super().RegisterResource(request)


class RecordingMocks(pulumi.runtime.Mocks):
    """Outputs echo the inputs plus what the program reads back; invokes answer in camelCase,
    as the real providers do. `offering` sets which zones offer the GPU instance type."""

    def __init__(self, region: str, offering: list[str] | None = None):
        self.region = region
        self.offering = ZONES[region][1:] if offering is None else offering
        self.resources: list[Recorded] = []
        self.calls: list[tuple[str, dict]] = []
        self.depends: dict[str, set[str]] = {}
        self.exports: dict = {}  # stack output -> resolved value
        self.secret_exports: set[str] = set()
        self.parents: dict[str, str | None] = {}
        self.options: dict[str, dict] = {}  # resource name -> the resource options that matter

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(Recorded(args.typ, args.name, dict(args.inputs)))
        # Echo inputs, minus references to other resources (echoing them would make the SDK
        # rehydrate those resources, which mocks cannot serve).
        outputs = {k: v for k, v in args.inputs.items() if not _has_resource(v)}
        if args.typ.startswith("aws:"):
            outputs.setdefault("name", args.name)  # auto-naming
        if args.typ == "eks:index:Cluster":
            outputs["kubeconfigJson"] = json.dumps({"apiVersion": "v1", "kind": "Config"})
        if args.typ == "aws:s3/bucket:Bucket":
            outputs.update(bucket=f"{args.name}-bucket", arn=f"arn:aws:s3:::{args.name}-bucket")
        if args.typ == "aws:iam/role:Role":
            outputs["arn"] = f"arn:aws:iam::123456789012:role/{args.name}"
        if args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            outputs["latestVersion"] = 1
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.calls.append((args.token, dict(args.args)))
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"names": ZONES[self.region], "id": self.region}
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            return {"locations": self.offering, "locationTypes": ["availability-zone"] * len(
                self.offering), "instanceTypes": ["g6.12xlarge"] * len(self.offering),
                "id": self.region}
        if args.token == "aws:eks/getCluster:getCluster":
            return {"name": args.args["name"], "endpoint": "https://eks.example",
                    "certificateAuthorities": [{"data": "Y2E="}],
                    "vpcConfig": {"clusterSecurityGroupId": "sg-eks-managed"}}
        return {}

    def depends_on(self, name: str, other: str) -> bool:
        """`name` (or a component above it) declares a dependency on `other`, directly or
        through the resources it depends on."""
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            if other in self.depends.get(current, ()):
                return True
            todo.extend(self.depends.get(current, ()))
            if self.parents.get(current):
                todo.append(self.parents[current])
        return False

    def of_type(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.type == typ]

    def one(self, typ: str, name_part: str = "") -> Recorded:
        found = [r for r in self.of_type(typ) if name_part in r.name]
        assert len(found) == 1, (typ, name_part, [r.name for r in found])
        return found[0]


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
                mocks: RecordingMocks | None = None) -> RecordingMocks:
    """The real program (program.run) under mocks, with the stack file's config + overrides."""
    import program

    raw, region = raw_config(stack_file)
    raw.update(overrides or {})
    mocks = mocks or RecordingMocks(region, offering)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack_name(stack_file), preview=False,
                             monitor=RecordingMonitor(mocks))
    config = {f"{PROJECT}:{k}": v for k, v in raw.items()}
    config["aws:region"] = region
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
    with mock.patch("pulumi.runtime.rpc.get_resource_module", return_value=None):
        deploy()
    return mocks
