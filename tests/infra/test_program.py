"""The Pulumi program under mocks: the resource graph `pulumi up` would create, per stack file."""

from __future__ import annotations

import json

import pytest

from infra.policies import NODE_POLICY_ARNS
from infra.zones import NetworkError
from tests.infra.mocks import ZONES, RecordingMocks, run_program
from tests.stack.stacks import STACK_FILES, stack_name

DEV = next(p for p in STACK_FILES if stack_name(p) == "dev")
EKS_MNG = "eks:index:ManagedNodeGroup"


@pytest.fixture(scope="module")
def dev():
    return run_program(DEV)


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
def test_every_stack_file_deploys_the_full_graph(path):
    m = run_program(path)
    for typ in ("aws:ec2/vpc:Vpc", "aws:ec2/natGateway:NatGateway", "eks:index:Cluster",
                "aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/placementGroup:PlacementGroup",
                "aws:s3/bucket:Bucket", "aws:eks/podIdentityAssociation:PodIdentityAssociation",
                "kubernetes:ray.io/v1:RayCluster"):
        assert m.of_type(typ), typ
    assert len(m.of_type(EKS_MNG)) == 2 and len(m.of_type("kubernetes:helm.sh/v3:Release")) == 3
    assert len(m.of_type("aws:ec2/natGateway:NatGateway")) == 1  # one NAT: cost


def test_subnets_span_two_zones_with_eks_role_tags_and_gpu_group_in_one(dev):
    subnets = {r.name: r.inputs for r in dev.of_type("aws:ec2/subnet:Subnet")}
    assert len({s["availabilityZone"] for s in subnets.values()}) == 2
    assert all(s["tags"].get("kubernetes.io/role/internal-elb") == "1"
               for n, s in subnets.items() if "private" in n)
    assert all(s["tags"].get("kubernetes.io/role/elb") == "1"
               for n, s in subnets.items() if "public" in n)
    gpu = dev.one(EKS_MNG, "gpu").inputs
    assert gpu["subnetIds"] == ["net-private-0-id"]
    # us-west-2a does not offer the type in these mocks: the first zone that does is chosen.
    assert subnets["net-private-0"]["availabilityZone"] == ZONES["us-west-2"][1]


def test_gpu_node_group_is_efa_wired(dev):
    gpu = dev.one(EKS_MNG, "gpu").inputs
    assert gpu["amiType"] == "AL2023_x86_64_NVIDIA" and gpu["instanceTypes"] == ["g6.12xlarge"]
    assert gpu["labels"] == {"role": "gpu-worker", "nvidia.com/gpu.present": "true",
                             "vpc.amazonaws.com/efa.present": "true"}
    assert gpu["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
    assert gpu["launchTemplate"]["id"] == "eks-gpu-lt-id"
    lt = dev.one("aws:ec2/launchTemplate:LaunchTemplate").inputs
    nic = lt["networkInterfaces"][0]
    assert (nic["interfaceType"], nic["deviceIndex"], nic["networkCardIndex"]) == ("efa", 0, 0)
    assert nic["securityGroups"] == ["sg-eks-managed"]  # EKS-managed SG: all traffic to itself
    assert lt["placement"]["groupName"] == "eks-gpu-pg"
    assert dev.one("aws:ec2/placementGroup:PlacementGroup").inputs["strategy"] == "cluster"
    assert lt["metadataOptions"]["httpTokens"] == "required"
    ebs = lt["blockDeviceMappings"][0]["ebs"]
    assert ebs["encrypted"] == "true" and ebs["volumeType"] == "gp3" and ebs["volumeSize"] >= 200
    assert "capacityReservationSpecification" not in lt


def test_system_node_group_and_cluster_access(dev):
    system = dev.one(EKS_MNG, "system").inputs
    assert system["amiType"] == "AL2023_x86_64_STANDARD" and system["labels"] == {"role": "system"}
    assert system["instanceTypes"] == ["m7i.xlarge"] and "taints" not in system
    cluster = dev.one("eks:index:Cluster").inputs
    assert cluster["authenticationMode"] == "API" and cluster["skipDefaultNodeGroup"] is True
    assert cluster["publicAccessCidrs"] == ["0.0.0.0/0"]
    addons = {r.inputs["addonName"] for r in dev.of_type("aws:eks/addon:Addon")}
    assert addons == {"eks-pod-identity-agent", "coredns"}
    assert dev.depends_on("eks-coredns", "eks-system")  # CoreDNS once system nodes exist


def test_admin_access_entry_and_private_endpoint():
    arn = "arn:aws:iam::123456789012:role/platform-admins"
    m = run_program(DEV, {"adminPrincipalArn": arn, "apiPrivateOnly": "true",
                          "apiPublicCidrs": '["0.0.0.0/0"]'})
    cluster = m.one("eks:index:Cluster").inputs
    entry = cluster["accessEntries"]["admin"]
    assert entry["principalArn"] == arn
    assert entry["accessPolicies"]["cluster-admin"]["policyArn"].endswith("AmazonEKSClusterAdminPolicy")
    assert cluster["endpointPublicAccess"] is False and "publicAccessCidrs" not in cluster


def test_node_roles_carry_only_node_policies(dev):
    attached = {r.inputs["policyArn"] for r in dev.of_type(
        "aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    assert attached == set(NODE_POLICY_ARNS)


def test_pausing_scales_gpu_nodes_and_ray_workers_to_zero_and_keeps_everything_else():
    paused = run_program(DEV, {"gpuNodeCount": "0"})
    scaling = paused.one(EKS_MNG, "gpu").inputs["scalingConfig"]
    assert scaling["desiredSize"] == 0 and scaling["minSize"] == 0 and scaling["maxSize"] >= 1
    worker = paused.one("kubernetes:ray.io/v1:RayCluster").inputs["spec"]["workerGroupSpecs"][0]
    assert worker["replicas"] == 0
    running = run_program(DEV)
    assert sorted(r.type for r in paused.resources) == sorted(r.type for r in running.resources)


def test_capacity_reservation_goes_into_the_launch_template():
    m = run_program(DEV, {"capacityReservation": json.dumps(
        {"id": "cr-0123456789abcdef0", "instanceCount": 2})})
    lt = m.one("aws:ec2/launchTemplate:LaunchTemplate").inputs
    target = lt["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == "cr-0123456789abcdef0"
    assert m.one(EKS_MNG, "gpu").inputs["capacityType"] == "ON_DEMAND"


def test_capacity_block_uses_its_market_type():
    m = run_program(DEV, {"capacityBlock": json.dumps(
        {"id": "cr-0123456789abcdef0", "instanceCount": 4})})
    lt = m.one("aws:ec2/launchTemplate:LaunchTemplate").inputs
    assert lt["instanceMarketOptions"]["marketType"] == "capacity-block"
    assert m.one(EKS_MNG, "gpu").inputs["capacityType"] == "CAPACITY_BLOCK"


def test_no_zone_offering_the_gpu_type_is_a_clear_error_before_any_resource():
    mocks = RecordingMocks("us-west-2", offering=[])
    with pytest.raises(NetworkError, match="no availability zone of this Region offers g6.12xlarge"):
        run_program(DEV, mocks=mocks)
    assert mocks.resources == []


def test_configured_zone_that_lacks_the_type_is_rejected():
    with pytest.raises(NetworkError, match="does not offer"):
        run_program(DEV, {"gpuAvailabilityZone": "us-west-2a"})


def test_bucket_is_private_encrypted_and_pods_reach_only_it(dev):
    assert dev.one("aws:s3/bucket:Bucket").inputs["forceDestroy"] is True  # dev stack setting
    pab = dev.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(pab[k] for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                "restrictPublicBuckets"))
    sse = dev.one("aws:s3/bucketServerSideEncryptionConfiguration:"
                  "BucketServerSideEncryptionConfiguration").inputs
    assert sse["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    policy = json.loads(dev.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    resources = {r for s in policy["Statement"] for r in [s["Resource"]]}
    assert resources == {"arn:aws:s3:::ckpt-checkpoints-bucket",
                         "arn:aws:s3:::ckpt-checkpoints-bucket/*"}
    assert all("*" not in a for s in policy["Statement"] for a in s["Action"])
    trust = json.loads(next(r for r in dev.of_type("aws:iam/role:Role")
                            if r.name == "ckpt-ray-pods").inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assoc = dev.one("aws:eks/podIdentityAssociation:PodIdentityAssociation").inputs
    assert (assoc["namespace"], assoc["serviceAccount"]) == ("ray", "ray-train")
    assert assoc["clusterName"] == "ray-train-dev"


def test_helm_releases_pinned_on_the_right_nodes_and_ordered(dev):
    releases = {r.inputs["chart"]: r for r in dev.of_type("kubernetes:helm.sh/v3:Release")}
    assert {c: r.inputs["version"] for c, r in releases.items()} == {
        "kuberay-operator": "1.7.0", "nvidia-device-plugin": "0.20.0",
        "aws-efa-k8s-device-plugin": "v0.5.8"}
    kuberay = releases["kuberay-operator"].inputs
    assert kuberay["values"]["nodeSelector"] == {"role": "system"} and kuberay["skipCrds"] is True
    for chart in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
        inputs = releases[chart].inputs
        assert inputs["skipAwait"] is True  # GPU nodes may be paused at zero
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            inputs["values"]["tolerations"]
    crds = [r.inputs["file"] for r in dev.of_type("kubernetes:yaml/v2:ConfigFile")]
    assert all("/kuberay/v1.7.0/" in url for url in crds) and len(crds) == 3
    for release in releases.values():
        assert dev.depends_on(release.name, "eks-system")
    assert dev.depends_on("addons-kuberay-operator", "addons-crd-ray.io_rayclusters.yaml")


def test_destroy_order_workloads_before_operator_before_node_groups(dev):
    # Pulumi deletes dependents first: RayJob/RayCluster (finalizers) go while the operator runs,
    # the operator and plugins while the nodes run.
    assert dev.depends_on("ray-raycluster", "addons-kuberay-operator")
    assert dev.depends_on("ray-rayjob", "addons-kuberay-operator")
    assert dev.depends_on("ray-rayjob", "ray-raycluster")
    for addon in ("addons-kuberay-operator", "addons-nvidia-device-plugin",
                  "addons-aws-efa-k8s-device-plugin"):
        assert dev.depends_on(addon, "eks-gpu") and dev.depends_on(addon, "eks-system")


def test_run_job_switch_deploys_infrastructure_only():
    m = run_program(DEV, {"runJob": "false"})
    assert not m.of_type("kubernetes:ray.io/v1:RayJob") and m.of_type("kubernetes:ray.io/v1:RayCluster")


def test_hub_token_becomes_a_kubernetes_secret_only_when_set(dev):
    assert not dev.of_type("kubernetes:core/v1:Secret")
    m = run_program(DEV, secrets={"hfToken": "hf_test_token"})
    secret = m.one("kubernetes:core/v1:Secret").inputs
    assert secret["metadata"] == {"name": "hf-token", "namespace": "ray"}
    assert "hf_test_token" in json.dumps(secret["stringData"])


def test_stack_outputs_and_kubeconfig_is_secret(dev):
    out = dev.exports
    assert out["clusterName"] == "ray-train-dev" and out["region"] == "us-west-2"
    assert out["gpuAvailabilityZone"] == "us-west-2b"
    assert out["nodeGroups"] == {"system": "ray-train-dev-system", "gpu": "ray-train-dev-gpu"}
    assert out["hourlyCostUsd"] == pytest.approx(sum(out["hourlyCostBreakdown"].values()))
    assert set(out["hourlyCostBreakdown"]) == {"gpuNodes", "systemNodes", "eksControlPlane",
                                               "natGateway"}
    assert "kubeconfig" in dev.secret_exports and "clusterName" not in dev.secret_exports
    assert out["checkpointStorage"].startswith("s3://") and out["rayJob"].startswith("ray-train-dev-")


def test_existing_cluster_mode_deploys_only_addons_and_workloads():
    m = run_program(DEV, {"existingClusterName": "shared-gpu"})
    types = {r.type for r in m.resources}
    assert not types & {"eks:index:Cluster", EKS_MNG, "aws:ec2/vpc:Vpc"}
    assert len(m.of_type("kubernetes:helm.sh/v3:Release")) == 3
    assert m.one("aws:eks/podIdentityAssociation:PodIdentityAssociation").inputs[
        "clusterName"] == "shared-gpu"


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
