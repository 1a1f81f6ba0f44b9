"""Run the Pulumi program under the mocks (tests/infra/mocks.py), with a monitor that behaves as
the engine does, and keep the refusals it provokes to the one error the test receives.

`preview=True` runs the program as `pulumi preview` does: nothing is created, computed outputs
stay unknown. The engine is the mocks' CLI version, gating invokes or not (tests/infra/mocks.py)."""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator
from unittest import mock

import grpc
import pulumi
from google.protobuf import json_format
from pulumi.runtime import rpc
from pulumi.runtime.proto import resource_pb2

from stack import catalog
from tests.infra import plain_inputs, release_server
from tests.infra.mocks import ProviderInvokeError, RecordingMocks
from tests.stack.stacks import PROJECT, raw_config, stack_name
from tests.training.kube_fake import FakeKube

# Set on an exception the monitor raised to refuse a registration (see quiet_refusals).
REFUSED = "_refused_by_the_mock_monitor"


class RecordingMonitor(pulumi.runtime.mocks.MockMonitor):
    """Also records each resource's declared dependencies (by name), for ordering checks. Like
    the engine it supports output values, so a remote component's inputs arrive with their
    Outputs as output values, and an Output in a plain input is refused (plain_inputs.py)."""

    def __init__(self, mocks: RecordingMocks):
        super().__init__(mocks)
        self.recorder = mocks
        mocks.monitor = self  # the mocks' EKS registers the aws.eks.Cluster inside pulumi-eks's

    def SupportsFeature(self, request):
        return type("SupportsFeatureResponse", (object,), {"hasSupport": True})

    def GetDeploymentInfo(self, request):
        info = super().GetDeploymentInfo(request)
        info.supportedFeatures.append(resource_pb2.RESOURCE_MONITOR_FEATURE_OUTPUT_VALUES)
        if self.recorder.gates_invokes:
            info.supportedFeatures.append(resource_pb2.RESOURCE_MONITOR_FEATURE_INVOKE_DEPENDS_ON)
        return info

    def Invoke(self, request):
        """A gating engine declines an invoke whose dependencies are pending creation, as they
        all are in a preview of resources the stack does not hold yet: the result is unknown. An
        older engine is sent no dependencies (the SDK checks only CustomResources' ids itself,
        pulumi/runtime/invoke.py) and runs every invoke it gets."""
        if self.recorder.preview and set(request.dependsOn) - self.recorder.urns:
            return resource_pb2.ResourceInvokeResponse(unknown=True)
        return super().Invoke(request)

    def RegisterResource(self, request):
        try:
            return self._register(request)
        except Exception as error:
            setattr(error, REFUSED, True)
            raise

    def _register(self, request):
        if request.remote:
            plain_inputs.check(request.type, request.name,
                               json_format.MessageToDict(request.object))
            resolved = resource_pb2.RegisterResourceRequest()
            resolved.CopyFrom(request)
            for value in resolved.object.fields.values():
                plain_inputs.resolve_output_values(value)
            request = resolved
        self.recorder.registering.urn = self.make_urn(request.parent, request.type, request.name)
        self.recorder.secret_inputs[request.name] = {  # what the state would hold encrypted
            k for k, v in json_format.MessageToDict(request.object).items()
            if isinstance(v, dict) and v.get(rpc._special_sig_key) == rpc._special_secret_sig}
        self.recorder.depends[request.name] = {u.rsplit("::", 1)[1] for u in request.dependencies}
        self.recorder.parents[request.name] = request.parent.rsplit("::", 1)[1] if request.parent else None
        self.recorder.ignore_changes[request.name] = list(request.ignoreChanges)
        refs = [request.provider, *request.providers.values()]
        self.recorder.providers[request.name] = {r.split("::")[-2] for r in refs if r}  # URN::id
        self.recorder.options[request.name] = {
            "retainOnDelete": request.retainOnDelete,
            "deleteBeforeReplace": request.deleteBeforeReplace,
            "replaceOnChanges": list(request.replaceOnChanges)}
        response = super().RegisterResource(request)
        if not self.recorder.preview:
            self.recorder.urns.add(response.urn)
        return response


# The first CLI whose engine serves RequirePulumiVersion (proto/pulumi/engine.proto, pulumi/pulumi
# #21528; 3.216.0 served it as CheckPulumiVersion): an older one answers UNIMPLEMENTED.
REQUIRE_VERSION_RPC_SINCE = "3.217.0"


class RecordingEngine(pulumi.runtime.mocks.MockEngine):
    """The engine's RequirePulumiVersion for a CLI of `version` (None: some CLI older than the
    RPC), answered UNIMPLEMENTED, as gRPC answers an unknown method, by CLIs before the RPC."""

    def __init__(self, version: str | None):
        super().__init__(None)
        self.version = version

    def RequirePulumiVersion(self, request):
        if self.version is None or _semver(self.version) < _semver(REQUIRE_VERSION_RPC_SINCE):
            raise ProviderInvokeError("unknown method RequirePulumiVersion",
                                      grpc.StatusCode.UNIMPLEMENTED)
        minimum = request.pulumi_version_range.removeprefix(">=")
        if _semver(self.version) < _semver(minimum):
            raise ProviderInvokeError(f"Pulumi CLI version {self.version} does not satisfy the "
                                      f"version range {request.pulumi_version_range!r}")


def _semver(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def quiet_refusals(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler under the mocks. A registration the monitor refuses
    (an Output in a plain input, the mocks' EKS answering 409) fails inside the SDK's
    register_resource, which sets that one exception on every output future of the resource
    (its urn, id and each property: pulumi/runtime/resource.py do_register,
    rpc.resolve_outputs_due_to_exception) and raises it to the program, so the test receives
    it. Nothing awaits the refused resource's own futures, so each reports "Future exception
    was never retrieved" when it is collected: those copies of a refusal the test already got
    are dropped here; every other report goes to the loop's default handler."""
    if "future" in context and getattr(context.get("exception"), REFUSED, False):
        return
    loop.default_exception_handler(context)


def run_program(stack_file: Path, overrides: dict[str, str] | None = None,
                offering: list[str] | None = None, secrets: dict[str, str] | None = None,
                mocks: RecordingMocks | None = None,
                aws_config: dict[str, str] | None = None, preview: bool = False,
                entry: Callable[[], None] | None = None,
                crd_url: str | None = None) -> RecordingMocks:
    """The real program (program.run, or `entry`) under mocks, with the stack file's config +
    overrides; `preview` (or the mocks' own setting) runs it as `pulumi preview`. KubeRay's
    CRDs come from the loopback release server (`crd_url`: another URL template)."""
    import program

    raw, region = raw_config(stack_file)
    raw.update(overrides or {})
    mocks = mocks or RecordingMocks(region, offering, preview=preview)
    # "organization": what a DIY (--local, S3) backend reports as the stack's organization.
    with mock.patch("pulumi.runtime.mocks.MockEngine",
                    lambda logger: RecordingEngine(mocks.cli_version)):
        pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack_name(stack_file),
                                 preview=mocks.preview,
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
        asyncio.get_running_loop().set_exception_handler(quiet_refusals)  # the SDK's own loop
        with mock.patch("pulumi.export", side_effect=exported.__setitem__):
            (entry or program.run)()
        return pulumi.Output.from_input(asyncio.ensure_future(resolve_exports()))

    # Resource references among the inputs stay URNs: the SDK would otherwise rebuild those
    # resources inside the mock monitor, on another event loop. Only the aws.eks.Cluster that
    # eks:index:Cluster returns is rebuilt, in the program, as the SDK does (through getResource).
    real_resource_module = rpc.get_resource_module

    def resource_module(pkg: str, mod: str, version: str):
        return real_resource_module(pkg, mod, version) if (pkg, mod) == ("aws", "eks/cluster") \
            else None

    with mock.patch("pulumi.runtime.rpc.get_resource_module", side_effect=resource_module), \
            mock.patch.object(catalog, "KUBERAY_CRD_URL", crd_url or release_server.crd_url()), \
            existing_cluster_api(mocks, bool(raw.get("existingClusterName"))):
        deploy()
    return mocks


@contextlib.contextmanager
def existing_cluster_api(mocks: RecordingMocks, existing: bool) -> Iterator[None]:
    """On an existing cluster, its Kubernetes API: a FakeKube over TLS serving the mocks' CRDs
    (and RBAC), at the endpoint and with the CA getCluster answers; its requests kept."""
    if not existing:
        yield
        return
    with FakeKube({"customresourcedefinitions": mocks.cluster_crds}, mocks.cluster_rbac,
                  tls_dir=_tls_dir(), user=mocks.deployer) as api:
        mocks.kube_endpoint = api.url
        mocks.kube_ca = base64.b64encode(api.ca_file.read_bytes()).decode()
        try:
            yield
        finally:
            mocks.kube_requests = list(api.requests)


@functools.cache
def _tls_dir() -> Path:
    """One self-signed server certificate for the whole session (FakeKube makes it once)."""
    path = Path(tempfile.mkdtemp(prefix="fake-eks-tls-"))
    atexit.register(shutil.rmtree, path, True)
    return path
