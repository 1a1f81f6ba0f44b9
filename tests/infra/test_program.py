"""The Pulumi program under mocks: the resource graph `pulumi up` would create, per stack file."""

from __future__ import annotations

import json

import pytest

from infra.policies import NODE_POLICY_ARNS
from infra.zones import EKS_UNSUPPORTED_ZONE_IDS, NetworkError
from tests.infra.harness import run_program
from tests.infra.mocks import ZONE_DATA, ZONES, RecordingMocks
from tests.stack.stacks import STACK_FILES, stack_name

DEV = next(p for p in STACK_FILES if stack_name(p) == "dev")
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LT = "aws:ec2/launchTemplate:LaunchTemplate"


def test_the_stack_files_are_found():
    # The per-stack tests below are parametrized over them: none found would run none.
    assert {"dev", "prod-use1"} <= {stack_name(p) for p in STACK_FILES}


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
def test_every_stack_file_deploys_the_full_graph(path):
    m = run_program(path)
    for typ in ("aws:ec2/vpc:Vpc", "aws:ec2/natGateway:NatGateway", "eks:index:Cluster",
                "aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/placementGroup:PlacementGroup",
                "aws:s3/bucket:Bucket", "aws:eks/podIdentityAssociation:PodIdentityAssociation",
                "kubernetes:core/v1:ServiceAccount"):  # the Ray workloads (a run only if runJob)
        assert m.of_type(typ), typ
    assert len(m.of_type(NODE_GROUP)) == 2 and len(m.of_type("kubernetes:helm.sh/v3:Release")) == 5  # with Kueue
    assert len(m.of_type("aws:ec2/natGateway:NatGateway")) == 1  # one NAT: cost


def test_subnets_span_two_zones_with_eks_role_tags_and_gpu_group_in_one(dev):
    subnets = {r.name: r.inputs for r in dev.of_type("aws:ec2/subnet:Subnet")}
    assert sorted(subnets) == ["net-private-0", "net-private-1", "net-public-0", "net-public-1"]
    assert len({s["availabilityZone"] for s in subnets.values()}) == 2
    assert all(s["tags"].get("kubernetes.io/role/internal-elb") == "1"
               for n, s in subnets.items() if "private" in n)
    assert all(s["tags"].get("kubernetes.io/role/elb") == "1"
               for n, s in subnets.items() if "public" in n)
    gpu = dev.one(NODE_GROUP, "gpu").inputs
    assert gpu["subnetIds"] == ["net-private-0-id"]
    # us-west-2a does not offer the type in these mocks: the first zone that does is chosen.
    assert subnets["net-private-0"]["availabilityZone"] == ZONES["us-west-2"][1]


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
def test_subnets_avoid_local_zones_and_zone_ids_eks_refuses(path):
    """The mocks answer like AWS: an opted-in Local Zone sorts first (us-west-2-lax-1a) and
    us-east-1b is use1-az3; both would become control-plane subnets without the filter."""
    m = run_program(path)
    ids = {name: zid for name, zid, _ in ZONE_DATA[m.region]}
    used = {r.inputs["availabilityZone"] for r in m.of_type("aws:ec2/subnet:Subnet")}
    assert len(used) == 2 and used <= set(ZONES[m.region])
    assert not {ids[z] for z in used} & EKS_UNSUPPORTED_ZONE_IDS


def _zones(m: RecordingMocks) -> list[str]:
    subnets = {r.name: r.inputs["availabilityZone"] for r in m.of_type("aws:ec2/subnet:Subnet")}
    return [subnets["net-private-0"], subnets["net-private-1"]]


def test_zones_stay_where_the_first_deployment_put_them():
    """AWS adds the GPU type to an earlier zone after the first deployment: a re-choice would
    replace the subnets (EC2 refuses a second subnet of the same CIDR; EKS refuses new
    control-plane zones). The next preview and update keep the first zones; only a configured
    gpuAvailabilityZone moves the GPU zone."""
    first = run_program(DEV, mocks=RecordingMocks("us-west-2", offering=["us-west-2c"]))
    assert _zones(first) == ["us-west-2c", "us-west-2a"]
    wider = ["us-west-2a", "us-west-2b", "us-west-2c"]
    assert _zones(run_program(DEV, mocks=RecordingMocks("us-west-2", wider))) == \
        ["us-west-2a", "us-west-2b"]  # what a new stack would choose now
    for preview in (True, False):
        later = run_program(DEV, mocks=RecordingMocks("us-west-2", wider, prior=first,
                                                      preview=preview))
        assert _zones(later) == ["us-west-2c", "us-west-2a"], preview
    assert later.exports["gpuAvailabilityZone"] == "us-west-2c"
    moved = run_program(DEV, {"gpuAvailabilityZone": "us-west-2b"},
                        mocks=RecordingMocks("us-west-2", wider, prior=later))
    assert _zones(moved) == ["us-west-2b", "us-west-2a"]


def test_gpu_node_group_is_efa_wired(dev):
    gpu = dev.one(NODE_GROUP, "gpu").inputs
    assert gpu["amiType"] == "AL2023_x86_64_NVIDIA" and gpu["instanceTypes"] == ["g6.12xlarge"]
    assert gpu["launchTemplate"]["id"] == "eks-gpu-lt-id"
    lt = dev.one(LT, "gpu-lt").inputs
    nic = lt["networkInterfaces"][0]
    assert (nic["interfaceType"], nic["deviceIndex"], nic["networkCardIndex"]) == ("efa", 0, 0)
    assert nic["securityGroups"] == ["sg-eks-managed"]  # EKS-managed SG: all traffic to itself
    assert lt["placement"]["groupName"] == "eks-gpu-pg"
    assert dev.one("aws:ec2/placementGroup:PlacementGroup").inputs["strategy"] == "cluster"
    ebs = lt["blockDeviceMappings"][0]["ebs"]
    assert ebs["encrypted"] == "true" and ebs["volumeType"] == "gp3" and ebs["volumeSize"] >= 200
    assert "capacityReservationSpecification" not in lt and "instanceType" not in lt


@pytest.mark.parametrize("template", ["gpu-lt", "system-lt"])
def test_pods_cannot_reach_the_node_role_through_the_metadata_service(dev, template):
    # Hop limit 1: the IMDSv2 token never reaches a pod's network namespace; Pod Identity needs none.
    assert dev.one(LT, template).inputs["metadataOptions"] == {
        "httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1}


def test_gpu_node_group_scales_from_zero_under_the_autoscaler(dev):
    """min 0 / desired 0 / max = gpuNodeCount; what cluster-autoscaler needs to build a node from
    the group's description (EFA count tag, labels, a taint with a value)."""
    gpu = dev.one(NODE_GROUP, "gpu").inputs
    assert gpu["scalingConfig"] == {"minSize": 0, "desiredSize": 0, "maxSize": 2}
    assert gpu["tags"]["k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"] == "1"
    assert gpu["labels"] == {"role": "gpu-worker", "nvidia.com/gpu.present": "true",
                             "vpc.amazonaws.com/efa.present": "true",
                             "k8s.amazonaws.com/accelerator": "nvidia-l4"}
    assert gpu["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
    assert run_program(DEV, {"gpuNodeCount": "5"}).one(NODE_GROUP, "gpu").inputs[
        "scalingConfig"]["maxSize"] == 5


def test_node_groups_follow_the_cluster_version_and_policies_outlive_them(dev):
    for group in ("system", "gpu"):
        # With a launch template EKS (and pulumi-eks) would not default the version: upgrades
        # of the cluster would never roll these nodes.
        assert dev.one(NODE_GROUP, group).inputs["version"] == "1.35"
        assert dev.options[f"eks-{group}"]["deleteBeforeReplace"] is True  # fixed names
        for arn in NODE_POLICY_ARNS:
            assert dev.depends_on(f"eks-{group}", f"eks-{group}-node-{arn.rsplit('/', 1)[1]}")
    assert run_program(DEV, {"kubernetesVersion": "1.34"}).one(NODE_GROUP, "gpu").inputs[
        "version"] == "1.34"


def test_system_node_group_and_cluster_access(dev):
    system = dev.one(NODE_GROUP, "system").inputs
    assert system["amiType"] == "AL2023_x86_64_STANDARD" and system["labels"] == {"role": "system"}
    assert system["instanceTypes"] == ["m7i.xlarge"] and "taints" not in system
    # The Ray head and the submitter pull the full Ray Train image here: not the 20 GiB default.
    assert system["launchTemplate"]["id"] == "eks-system-lt-id"
    ebs = dev.one(LT, "system-lt").inputs["blockDeviceMappings"][0]["ebs"]
    assert ebs["volumeSize"] >= 100 and ebs["volumeType"] == "gp3" and ebs["encrypted"] == "true"
    cluster = dev.one("eks:index:Cluster").inputs
    assert cluster["authenticationMode"] == "API" and cluster["skipDefaultNodeGroup"] is True
    assert cluster["publicAccessCidrs"] == ["0.0.0.0/0"]
    assert dev.depends_on("eks-coredns", "eks-system")  # CoreDNS once system nodes exist


def test_eks_addons_are_pinned_and_overwrite_the_self_managed_coredns(dev):
    addons = {r.inputs["addonName"]: r.inputs for r in dev.of_type("aws:eks/addon:Addon")}
    assert set(addons) == {"eks-pod-identity-agent", "coredns", "eks-node-monitoring-agent"}
    for addon in addons.values():
        assert addon["resolveConflictsOnCreate"] == addon["resolveConflictsOnUpdate"] == "OVERWRITE"
    assert addons["coredns"]["addonVersion"] == "v1.13.2-eksbuild.4"
    assert addons["eks-pod-identity-agent"]["addonVersion"].startswith("v1.")


def test_node_roles_carry_only_node_policies(dev):
    """Join the cluster, pull images, run the VPC CNI: nothing that reaches S3 or the account
    (pods get AWS access through Pod Identity, never through the node role)."""
    attached: dict[str, set[str]] = {}
    for r in dev.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
        attached.setdefault(r.inputs["role"], set()).add(r.inputs["policyArn"])
    managed = "arn:aws:iam::aws:policy/"
    assert attached == {f"eks-{group}-node": {
        f"{managed}AmazonEKSWorkerNodePolicy", f"{managed}AmazonEC2ContainerRegistryReadOnly",
        f"{managed}AmazonEKS_CNI_Policy"} for group in ("system", "gpu")}


def test_gpu_node_count_zero_keeps_the_whole_stack_and_no_gpu_node_can_start():
    # Idle GPU nodes now go on their own (scale from zero); gpuNodeCount 0 still deploys everything
    # else, with the cap EKS requires (max >= 1) and nothing that asks for it.
    paused = run_program(DEV, {"gpuNodeCount": "0"})
    scaling = paused.one(NODE_GROUP, "gpu").inputs["scalingConfig"]
    assert scaling == {"desiredSize": 0, "minSize": 0, "maxSize": 1}
    assert not paused.of_type("kubernetes:ray.io/v1:RayJob")  # a run needs GPU nodes
    running = run_program(DEV)
    # What a run brings: its RayJob and its code; the head's Roles are there for any run.
    of_a_run = ("kubernetes:ray.io/v1:RayJob", "kubernetes:core/v1:ConfigMap")
    assert sorted(r.type for r in paused.resources) == sorted(
        r.type for r in running.resources if not r.type.startswith(of_a_run))


RESERVATION = {"id": "cr-0123456789abcdef0", "instanceCount": 2}


def test_capacity_reservation_goes_into_the_launch_template_without_a_placement_group():
    m = run_program(DEV, {"capacityReservation": json.dumps(RESERVATION),
                          "gpuAvailabilityZone": "us-west-2c"})
    lt = m.one(LT, "gpu-lt").inputs
    target = lt["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == "cr-0123456789abcdef0"
    assert m.one(NODE_GROUP, "gpu").inputs["capacityType"] == "ON_DEMAND"
    # A reservation made outside a new placement group may not serve launches into it.
    assert not m.of_type("aws:ec2/placementGroup:PlacementGroup") and "placement" not in lt
    # The reservation's zone is the GPU zone.
    assert m.exports["gpuAvailabilityZone"] == "us-west-2c"


def test_capacity_block_names_its_instance_type_in_the_launch_template_only():
    m = run_program(DEV, {"capacityBlock": json.dumps({**RESERVATION, "instanceCount": 4}),
                          "gpuInstanceType": "p5.48xlarge", "gpuAvailabilityZone": "us-west-2b"})
    lt = m.one(LT, "gpu-lt").inputs
    assert lt["instanceMarketOptions"]["marketType"] == "capacity-block"
    assert lt["instanceType"] == "p5.48xlarge"
    assert lt["capacityReservationSpecification"]["capacityReservationTarget"][
        "capacityReservationId"] == "cr-0123456789abcdef0"
    gpu = m.one(NODE_GROUP, "gpu").inputs
    assert gpu["capacityType"] == "CAPACITY_BLOCK" and "instanceTypes" not in gpu
    assert not m.of_type("aws:ec2/placementGroup:PlacementGroup")


def test_no_zone_offering_the_gpu_type_is_a_clear_error_before_any_resource():
    mocks = RecordingMocks("us-west-2", offering=[])
    with pytest.raises(NetworkError, match="no availability zone of this Region offers g6.12xlarge"):
        run_program(DEV, mocks=mocks)
    assert mocks.resources == []


def test_configured_zone_that_lacks_the_type_is_rejected():
    with pytest.raises(NetworkError, match="does not offer"):
        run_program(DEV, {"gpuAvailabilityZone": "us-west-2a"})


def test_private_subnets_reach_s3_through_a_gateway_endpoint(dev):
    endpoint = dev.one("aws:ec2/vpcEndpoint:VpcEndpoint").inputs
    assert endpoint["serviceName"] == "com.amazonaws.us-west-2.s3"
    assert endpoint["vpcEndpointType"] == "Gateway"
    assert endpoint["routeTableIds"] == ["net-private-rt-id"]


def test_helm_releases_pinned_on_the_right_nodes_and_ordered(dev):
    releases = {r.inputs["chart"]: r for r in dev.of_type("kubernetes:helm.sh/v3:Release")}
    assert {c: r.inputs["version"] for c, r in releases.items()} == {
        "kuberay-operator": "1.7.0", "nvidia-device-plugin": "0.20.0",
        "aws-efa-k8s-device-plugin": "v0.5.30", "cluster-autoscaler": "9.59.0",
        "oci://registry.k8s.io/kueue/charts/kueue": "0.19.2"}
    kuberay = releases["kuberay-operator"].inputs
    assert kuberay["values"]["nodeSelector"] == {"role": "system"} and kuberay["skipCrds"] is True
    for chart in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
        inputs = releases[chart].inputs
        assert inputs["skipAwait"] is True  # GPU nodes sit at zero between runs
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            inputs["values"]["tolerations"]
    for release in releases.values():
        assert dev.depends_on(release.name, "eks-system")
    for crd in dev.of_type("kubernetes:yaml/v2:ConfigGroup", "addons-crd-"):  # tests/workloads
        assert dev.depends_on("addons-kuberay-operator", crd.name)


def test_cluster_autoscaler_release_is_pinned_on_the_system_node_with_its_own_role(dev):
    release = next(r for r in dev.of_type("kubernetes:helm.sh/v3:Release")
                   if r.inputs["chart"] == "cluster-autoscaler").inputs
    assert release["repositoryOpts"]["repo"] == "https://kubernetes.github.io/autoscaler"
    values = release["values"]
    # Image minor = the cluster's Kubernetes minor (1.35 by default).
    assert values["image"]["tag"].startswith("v1.35.")
    assert values["autoDiscovery"]["clusterName"] == "ray-train-dev"
    assert values["nodeSelector"] == {"role": "system"} and values["awsRegion"] == "us-west-2"
    args = values["extraArgs"]
    assert args["scale-down-unneeded-time"] == args["scale-down-delay-after-add"] == "2m"
    assert args["balance-similar-node-groups"] is False and args["expander"] == "least-waste"
    assoc = dev.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "autoscaler").inputs
    assert (assoc["namespace"], assoc["serviceAccount"]) == ("kube-system", "cluster-autoscaler")
    assert values["rbac"]["serviceAccount"]["name"] == assoc["serviceAccount"]
    assert values["fullnameOverride"] == "cluster-autoscaler"  # docs/running-on-eks.md's kubectl commands
    assert assoc["roleArn"] == "arn:aws:iam::123456789012:role/autoscaler-role"
    policy = json.loads(dev.one("aws:iam/rolePolicy:RolePolicy", "autoscaler").inputs["policy"])
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert {"eks:DescribeNodegroup", "autoscaling:SetDesiredCapacity",
            "autoscaling:TerminateInstanceInAutoScalingGroup"} <= actions
    assert not {a for a in actions if a.endswith("*")}  # named actions only
    # Scaling only this cluster's node groups: EKS tags their ASGs k8s.io/cluster-autoscaler/<name>.
    (scaling,) = [s for s in policy["Statement"] if {"autoscaling:SetDesiredCapacity",
                  "autoscaling:TerminateInstanceInAutoScalingGroup"} & set(s["Action"])]
    assert scaling["Condition"] == {"StringEquals": {
        "aws:ResourceTag/k8s.io/cluster-autoscaler/ray-train-dev": "owned"}}
    assert all("Condition" not in s for s in policy["Statement"] if s is not scaling)
    assert dev.depends_on("addons-cluster-autoscaler", "autoscaler-identity")
    older = run_program(DEV, {"kubernetesVersion": "1.34"}).one(
        "kubernetes:helm.sh/v3:Release", "cluster-autoscaler").inputs
    assert older["values"]["image"]["tag"].startswith("v1.34.")


def test_destroy_order_workloads_before_operator_before_node_groups(dev):
    # Pulumi deletes dependents first: the RayJob (finalizer; its cluster goes with it) while
    # the operator runs, the operator and plugins while the nodes run.
    assert dev.depends_on("ray-rayjob", "addons-kuberay-operator")
    for addon in ("addons-kuberay-operator", "addons-nvidia-device-plugin",
                  "addons-aws-efa-k8s-device-plugin"):
        assert dev.depends_on(addon, "eks-gpu") and dev.depends_on(addon, "eks-system")


def test_run_job_switch_deploys_infrastructure_only():
    m = run_program(DEV, {"runJob": "false"})
    assert not m.of_type("kubernetes:ray.io/v1:RayJob")
    assert not m.of_type("kubernetes:ray.io/v1:RayCluster")  # no long-lived cluster either


def test_hub_token_becomes_a_kubernetes_secret_only_when_set(dev):
    assert not dev.of_type("kubernetes:core/v1:Secret")
    m = run_program(DEV, secrets={"hfToken": "hf_test_token"})
    secret = m.one("kubernetes:core/v1:Secret").inputs
    assert secret["metadata"] == {"name": "hf-token", "namespace": "ray"}
    assert "hf_test_token" in json.dumps(secret["stringData"])


def test_a_hub_token_stored_in_plaintext_is_refused_before_any_resource():
    from stack.config import ConfigError

    mocks = RecordingMocks("us-west-2")
    with pytest.raises(ConfigError, match=r"hfToken: stored in plaintext \(Pulumi.dev.yaml.*"
                                          r"pulumi config set --secret hfToken"):
        run_program(DEV, {"hfToken": "hf_plain_token"}, mocks=mocks)
    assert mocks.resources == []


TRACKING = {"mlflowTrackingUri": "https://mlflow.example.com", "mlflowTrackingUsername": "alice"}


def test_tracking_credentials_go_into_a_kubernetes_secret_only():
    from stack.config import ConfigError

    mocks = RecordingMocks("us-west-2")
    with pytest.raises(ConfigError, match=r"mlflowTrackingPassword: stored in plaintext .*"
                                          r"pulumi config set --secret mlflowTrackingPassword"):
        run_program(DEV, {**TRACKING, "mlflowTrackingPassword": "s3cret"}, mocks=mocks)
    assert mocks.resources == []
    m = run_program(DEV, TRACKING, secrets={"mlflowTrackingPassword": "s3cret"})
    secret = m.one("kubernetes:core/v1:Secret", "mlflow").inputs
    assert secret["metadata"] == {"name": "mlflow-tracking", "namespace": "ray"}
    assert m.secret_inputs["ray-mlflow"] >= {"stringData"}  # encrypted in the state
    assert "s3cret" in json.dumps(secret["stringData"])
    assert "s3cret" not in json.dumps(m.one("kubernetes:ray.io/v1:RayJob").inputs)
    assert m.depends_on("ray-rayjob", "ray-mlflow")


def test_stack_outputs_and_kubeconfig_is_secret(dev):
    out = dev.exports
    assert out["clusterName"] == "ray-train-dev" and out["region"] == "us-west-2"
    assert out["gpuAvailabilityZone"] == "us-west-2b"
    assert out["nodeGroups"] == {"system": "ray-train-dev-system", "gpu": "ray-train-dev-gpu"}
    assert out["runCostUsdPerHour"] == pytest.approx(sum(out["hourlyCostBreakdown"].values()))
    breakdown = out["hourlyCostBreakdown"]
    assert out["idleCostUsdPerHour"] == pytest.approx(
        out["runCostUsdPerHour"] - sum(v for k, v in breakdown.items() if k.endswith("DuringRun")))
    assert set(breakdown) == {"gpuNodesDuringRun", "gpuRootVolumesDuringRun",
                              "gpuRootVolumePerformanceDuringRun", "systemNodes",
                              "systemRootVolumes", "systemRootVolumePerformance",
                              "eksControlPlane", "natGateway", "natPublicIpv4"}
    assert "kubeconfig" in dev.secret_exports and "clusterName" not in dev.secret_exports
    assert out["costIsEstimate"] is False and out["costSource"].endswith("us-west-2")
    assert out["checkpointStorage"].startswith("s3://") and out["rayJob"].startswith("ray-train-dev-")


@pytest.mark.parametrize("region, partition", [("cn-north-1", "aws-cn"),
                                               ("us-gov-west-1", "aws-us-gov")])
def test_a_region_outside_the_aws_partition_is_refused_before_any_resource(region, partition):
    from infra.lookups import PartitionError

    mocks = RecordingMocks("us-west-2")
    with pytest.raises(PartitionError, match=f"^aws:region: {region} is in the {partition} "
                                             "partition; this stack supports only"):
        run_program(DEV, mocks=mocks, aws_config={"region": region})
    assert mocks.resources == []


def test_bad_config_stops_the_program_before_any_resource():
    from stack.config import ConfigError

    mocks = RecordingMocks("us-west-2")
    with pytest.raises(ConfigError, match="gpuNodeCount"):
        run_program(DEV, {"gpuNodeCount": "-3"}, mocks=mocks)
    assert mocks.resources == []


@pytest.mark.parametrize("overrides, key", [
    ({"gpuNodes": "3"}, "gpuNodes: unknown key; did you mean gpuNodeCount?"),
    ({"training": '{"maxFailure": 1}'}, "training.maxFailure: unknown key; did you mean "
                                        "training.maxFailures?"),
])
def test_a_typo_in_a_stack_key_fails_under_pulumi_up_before_any_resource(overrides, key):
    """`pulumi up` hands the program every key of the stack (stack.pulumi_config), so a typo
    is an error naming the key and its closest known key, not a silently ignored value."""
    from stack.config import ConfigError

    mocks = RecordingMocks("us-west-2")
    with pytest.raises(ConfigError, match=key.replace("?", r"\?")):
        run_program(DEV, overrides, mocks=mocks)
    assert mocks.resources == []
