"""The mocks' EKS: what pulumi-eks and the aws provider do in AWS across updates, answered as they
answer it (RecordingMocks mixes this in).

- Reads of what does not exist fail as the engine reports a provider error: "invocation of <tok>
  returned an error: ... reading EKS Cluster (<name>): couldn't find resource" (pulumi/pulumi
  source_eval.go Invoke; terraform-provider-aws data sources, retry.NotFoundError).
- The access-entry data source returns no tags (access_entry_datasource.go: no @Tags, `tags` an
  argument echoed back); the resource Read (`AccessEntry.get`) returns them (access_entry.go).
- eks:index:Cluster creates the cluster with the creator's entry (bootstrapClusterCreatorAdmin
  Permissions) and one entry per `accessEntries` item, deleting the stack's own entries it no
  longer declares; a second entry for a principal is a 409. Its `eksCluster` output is a resource
  reference to the aws.eks.Cluster inside it, which the SDK rehydrates through getResource.
- A node group update runs as node_group.go resourceNodeGroupUpdate does: a launch-template or
  version change first (the roll, during which `autoscaler` may resize the group), then the whole
  scaling block only if it differs from the state, the `ignoreChanges` paths left out of that
  comparison; the state then records the live scaling (resourceNodeGroupRead). Its repair
  config is Optional+Computed and not ForceNew: created off unless declared, changed in place
  (UpdateNodegroupConfig, no roll) only when declared and different, kept when left out.
- An add-on's configurationValues are checked against its configuration schema, as CreateAddon
  and UpdateAddon do (tests/infra/mock_addons.py).
- The existing cluster's endpoint is a fake Kubernetes API on loopback, over TLS with its own CA
  (tests/training/kube_fake.py FakeKube, started by the harness), which takes the token
  getClusterAuth returns.
"""

from __future__ import annotations

import json
from typing import Callable

import grpc
import pulumi
from pulumi.runtime import rpc

from infra.access import principal_key
from tests.infra.mock_addons import check_configuration
from tests.training.kube_fake import TOKEN as KUBE_TOKEN

DESIRED = "scalingConfig.desiredSize"


class ProviderInvokeError(grpc.RpcError):
    """A provider's failed invoke as the engine answers it: a gRPC error whose details carry the
    provider's message (pulumi/pulumi source_eval.go Invoke: "invocation of <tok> returned an
    error: ..."); the SDK raises it in the program as a plain, catchable Exception
    (pulumi/runtime/invoke.py, grpc_error_to_exception)."""

    def __init__(self, details: str, code: grpc.StatusCode = grpc.StatusCode.UNKNOWN):
        super().__init__(details)
        self._details, self._code = details, code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def not_found(token: str, what: str) -> ProviderInvokeError:
    return ProviderInvokeError(f"invocation of {token} returned an error: 1 error occurred:\n\t* "
                               f"{what}: couldn't find resource")


def _resource_ref(urn: str, id_: str) -> dict:
    """A resource reference as the engine serializes one (pulumi/runtime/rpc.py)."""
    return {rpc._special_sig_key: rpc._special_resource_sig, "urn": urn, "id": id_}


class EksAccount:
    """State (`prior`: the previous run's mocks): clusters (name -> principal ARN -> tags), the
    principals of the stack's own entries, node groups' live scaling ((cluster, group) -> dict),
    the node groups' and launch templates' Pulumi state."""

    def _init_eks(self, prior: "EksAccount | None") -> None:
        self.clusters: dict[str, dict[str, dict]] = (
            {c: dict(e) for c, e in prior.clusters.items()} if prior else {"shared-gpu": {}})
        self.own_entries: dict[str, set[str]] = dict(prior.own_entries) if prior else {}
        self.scaling: dict[tuple[str, str], dict] = (
            {k: dict(v) for k, v in prior.scaling.items()} if prior else {})
        self.node_group_state: dict[str, dict] = dict(prior.node_group_state) if prior else {}
        self.templates: dict[str, tuple[str, int]] = dict(prior.templates) if prior else {}
        # (cluster, group) -> how EKS describes the group besides its scaling (the ForceNew
        # arguments: a change replaces the group, which then holds the new values).
        self.described: dict[tuple[str, str], dict] = dict(prior.described) if prior else {}
        # Called with the live scaling of a node group while its launch template or version
        # rolls: what cluster-autoscaler does meanwhile.
        self.autoscaler: Callable[[dict], None] | None = None
        self.rolls: list[str] = []  # node groups rolled in this run
        self.scaling_sent: list[dict] = []  # UpdateNodegroupConfig scaling blocks of this run
        # (cluster, group) -> its nodeRepairConfig as EKS holds it; the blocks sent this run.
        self.repair: dict[tuple[str, str], dict] = dict(prior.repair) if prior else {}
        self.repair_sent: list[dict] = []
        # The existing cluster's Kubernetes API: what it serves (the harness puts a FakeKube at
        # this endpoint with these CRDs and, unless None, RBAC) and the requests it got.
        self.kube_endpoint, self.kube_ca = "https://eks.example", "Y2E="
        self.cluster_crds: list[dict] = []
        self.cluster_rbac: list[dict] | None = None
        self.kube_requests: list[tuple] = []

    def eks_resource(self, args: pulumi.runtime.MockResourceArgs, outputs: dict) -> None:
        """The AWS side of an update (not a preview) of the resource types above."""
        if args.typ == "eks:index:Cluster":
            self._create_cluster(args.inputs.get("name") or args.name, args.inputs)
            outputs["kubeconfigJson"] = json.dumps({"apiVersion": "v1", "kind": "Config"})
        if args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            text = json.dumps(args.inputs, sort_keys=True, default=str)
            old_text, version = self.templates.get(args.name, (text, 1))
            self.templates[args.name] = (text, version + (text != old_text))
            outputs["latestVersion"] = self.templates[args.name][1]
        if args.typ == "aws:eks/nodeGroup:NodeGroup":
            outputs["scalingConfig"] = self._update_node_group(args.name, dict(args.inputs))
            outputs["nodeRepairConfig"] = self._update_repair(dict(args.inputs))
        if args.typ == "aws:eks/addon:Addon":
            check_configuration(args.inputs["addonName"], args.inputs.get("configurationValues"))

    def eks_cluster_output(self, name: str, component_urn: str, outputs: dict) -> None:
        """`eksCluster`, once the cluster exists: a reference to the aws.eks.Cluster child,
        registered with the monitor so that the SDK's getResource finds it."""
        if name not in self.clusters:
            return
        stack, project, typ, component = component_urn.split("::")
        assert typ.endswith("eks:index:Cluster"), component_urn  # this thread's registration
        urn = "::".join([stack, project, f"{typ}$aws:eks/cluster:Cluster",
                         f"{component}-eksCluster"])
        state = {"name": name, "arn": f"arn:aws:eks:{self.region}:123456789012:cluster/{name}",
                 "endpoint": "https://eks.example", "certificateAuthority": {"data": "Y2E="},
                 "vpcConfig": {"clusterSecurityGroupId": "sg-eks-managed"}}
        self.monitor.resources[urn] = pulumi.runtime.mocks.MockMonitor.ResourceRegistration(
            urn, name, state)
        outputs["eksCluster"] = _resource_ref(urn, name)

    def _create_cluster(self, name: str, inputs: dict) -> None:
        if name not in self.clusters:
            self.clusters[name] = {self.deployer_issuer(): {}}
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

    def read_access_entry(self, entry_id: str) -> tuple[str, dict]:
        """`aws.eks.AccessEntry.get`: the resource Read, which, unlike the data source, sets the
        entry's tags (access_entry.go, @Tags); a missing entry fails the Read as the engine
        reports it."""
        cluster, arn = entry_id.split(":", 1)
        if arn not in self.clusters.get(cluster, {}):
            raise ValueError(f"reading resource aws:eks/accessEntry:AccessEntry: resource "
                             f"'{entry_id}' does not exist")
        tags = dict(self.clusters[cluster][arn])
        return entry_id, {"clusterName": cluster, "principalArn": arn, "tags": tags,
                          "tagsAll": tags, "type": "STANDARD",
                          "accessEntryArn": f"arn:aws:eks:{self.region}:123456789012:"
                                            f"access-entry/{cluster}/{arn.rsplit('/', 1)[-1]}"}

    def _update_node_group(self, name: str, inputs: dict) -> dict:
        """Create, or update as the provider does; returns the live scaling (the Read)."""
        key = (inputs["clusterName"], inputs["nodeGroupName"])
        self.described[key] = {"capacityType": inputs.get("capacityType") or "ON_DEMAND",
                               "instanceTypes": inputs.get("instanceTypes"),
                               "amiType": inputs.get("amiType")}
        state = self.node_group_state.get(name)
        ignored = DESIRED in self.ignore_changes.get(name, [])
        if state is None or key not in self.scaling:
            self.scaling[key] = dict(inputs["scalingConfig"])
        else:
            old_inputs, old = state["inputs"], state["outputs"]
            if ignored:  # the engine puts the old input in place of the new one
                inputs["scalingConfig"] = {**inputs["scalingConfig"],
                                           "desiredSize": old_inputs["scalingConfig"]["desiredSize"]}
            if (inputs.get("launchTemplate"), inputs.get("version")) != \
                    (old["launchTemplate"], old["version"]):
                self.rolls.append(name)
                if self.autoscaler:
                    self.autoscaler(self.scaling[key])
            compared = [k for k in ("minSize", "maxSize", "desiredSize")
                        if not (ignored and k == "desiredSize")]
            if any(inputs["scalingConfig"][k] != old["scalingConfig"][k] for k in compared):
                sent = dict(inputs["scalingConfig"])
                if ignored:  # the planned value of an ignored path is the state's
                    sent["desiredSize"] = old["scalingConfig"]["desiredSize"]
                self.scaling[key] = sent
                self.scaling_sent.append(sent)
        live = dict(self.scaling[key])
        self.node_group_state[name] = {"inputs": inputs, "outputs": {
            "launchTemplate": inputs.get("launchTemplate"), "version": inputs.get("version"),
            "scalingConfig": live}}
        return live

    def _update_repair(self, inputs: dict) -> dict:
        """CreateNodegroup records the declared repair config (EKS's default: off); an update
        sends one only when declared and different from what EKS holds. Returns the Read."""
        key, declared = (inputs["clusterName"], inputs["nodeGroupName"]), inputs.get(
            "nodeRepairConfig")
        if key not in self.repair:
            self.repair[key] = dict(declared or {"enabled": False})
        elif declared is not None and declared != self.repair[key]:
            self.repair[key] = dict(declared)
            self.repair_sent.append(dict(declared))
        return dict(self.repair[key])

    def eks_call(self, token: str, args: dict) -> dict | None:
        """EKS data sources; None for any other token."""
        if token == "aws:eks/getNodeGroups:getNodeGroups":
            return {"clusterName": args["clusterName"], "id": args["clusterName"],
                    "names": sorted(self.existing_node_groups)}
        if token == "aws:eks/getNodeGroup:getNodeGroup":
            cluster, group = args["clusterName"], args["nodeGroupName"]
            found = {"clusterName": cluster, "id": f"{cluster}:{group}", "nodeGroupName": group}
            if (cluster, group) in self.scaling:
                return {**found, **self.described.get((cluster, group), {}),
                        "scalingConfigs": [self.scaling[cluster, group]]}
            if cluster == "shared-gpu" and group in self.existing_node_groups:
                return {**found, **self.existing_node_groups[group]}
            raise not_found(token, f"reading EKS Node Group ({cluster}:{group})")
        if token == "aws:eks/getAddon:getAddon":
            cluster, addon = args["clusterName"], args["addonName"]
            if cluster not in self.clusters or addon not in self.existing_addons:
                raise not_found(token, f"reading EKS Add-On ({cluster}:{addon})")
            return {"addonName": addon, "clusterName": cluster,
                    "addonVersion": "v1.3.10-eksbuild.3", "id": addon}
        if token == "aws:eks/getCluster:getCluster":
            if args["name"] not in self.clusters:
                raise not_found(token, f"reading EKS Cluster ({args['name']})")
            return {"name": args["name"], "endpoint": self.kube_endpoint,
                    "certificateAuthorities": [{"data": self.kube_ca}],
                    "vpcConfig": {"clusterSecurityGroupId": "sg-eks-managed"}}
        if token == "aws:eks/getClusterAuth:getClusterAuth":
            # A presigned STS call, made without asking EKS whether the cluster exists
            # (cluster_auth_data_source.go); the fake API takes this token.
            return {"id": args["name"], "name": args["name"], "token": KUBE_TOKEN}
        if token == "aws:eks/getAccessEntry:getAccessEntry":
            cluster, arn = args["clusterName"], args["principalArn"]
            if arn not in self.clusters.get(cluster, {}):
                raise not_found(token, f"reading EKS Access Entry ({cluster}:{arn})")
            return {"clusterName": cluster, "principalArn": arn, "id": f"{cluster}:{arn}",
                    "tags": args.get("tags") or {}, "type": "STANDARD"}
        return None
