"""The Pulumi program under mocks: the resource graph `pulumi up` would create, per stack file."""

from __future__ import annotations

import json

import pytest

from infra.policies import NODE_POLICY_ARNS
from infra.zones import NetworkError
from infra.zones import EKS_UNSUPPORTED_ZONE_IDS
from tests.infra.harness import run_program
from tests.infra.mocks import ZONE_DATA, ZONES, RecordingMocks
from tests.stack.stacks import PROJECT, STACK_FILES, stack_name

DEV = next(p for p in STACK_FILES if stack_name(p) == "dev")
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LT = "aws:ec2/launchTemplate:LaunchTemplate"


@pytest.fixture(scope="module")
def dev():
    return run_program(DEV)


def test_the_stack_files_are_found():
    # The per-stack tests below are parametrized over them: none found would run none.
    assert {"dev", "prod-use1"} <= {stack_name(p) for p in STACK_FILES}


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
def test_every_stack_file_deploys_the_full_graph(path):
    m = run_program(path)
    for typ in ("aws:ec2/vpc:Vpc", "aws:ec2/natGateway:NatGateway", "eks:index:Cluster",
                "aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/placementGroup:PlacementGroup",
                "aws:s3/bucket:Bucket", "aws:eks/podIdentityAssociation:PodIdentityAssociation",
                "kubernetes:core/v1:ConfigMap"):  # the Ray workloads (a RayJob only if runJob)
        assert m.of_type(typ), typ
    assert len(m.of_type(NODE_GROUP)) == 2 and len(m.of_type("kubernetes:helm.sh/v3:Release")) == 4
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


def test_a_scaling_change_keeps_the_live_desired_size():
    """The aws provider sends the whole scaling block on any change of it (terraform-provider-aws
    eks/node_group.go): the declared desired size is the live one, so raising gpuNodeCount during
    a run keeps its nodes, and lowering it after the run (state may hold a refreshed 2) starts
    none. ignoreChanges would send the size in Pulumi's state instead."""
    first = run_program(DEV)
    assert first.ignore_changes["eks-gpu"] == []
    key = ("ray-train-dev", "ray-train-dev-gpu")
    first.scaling[key]["desiredSize"] = 2  # a run: the autoscaler added two nodes
    during = run_program(DEV, {"gpuNodeCount": "3"}, mocks=RecordingMocks("us-west-2", prior=first))
    assert during.one(NODE_GROUP, "gpu").inputs["scalingConfig"] == {
        "minSize": 0, "desiredSize": 2, "maxSize": 3}
    during.scaling[key]["desiredSize"] = 0  # the run ended; its nodes went
    after = run_program(DEV, {"gpuNodeCount": "1"}, mocks=RecordingMocks("us-west-2", prior=during))
    assert after.one(NODE_GROUP, "gpu").inputs["scalingConfig"]["desiredSize"] == 0
    after.scaling[key]["desiredSize"] = 3
    capped = run_program(DEV, {"gpuNodeCount": "1"}, mocks=RecordingMocks("us-west-2", prior=after))
    assert capped.one(NODE_GROUP, "gpu").inputs["scalingConfig"]["desiredSize"] == 1  # <= max


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
    assert set(addons) == {"eks-pod-identity-agent", "coredns"}
    for addon in addons.values():
        assert addon["resolveConflictsOnCreate"] == addon["resolveConflictsOnUpdate"] == "OVERWRITE"
    assert addons["coredns"]["addonVersion"] == "v1.13.2-eksbuild.4"
    assert addons["eks-pod-identity-agent"]["addonVersion"].startswith("v1.")


def test_admin_access_entry_and_private_endpoint():
    arn = "arn:aws:iam::123456789012:role/platform-admins"
    m = run_program(DEV, {"adminPrincipalArn": arn, "apiPrivateOnly": "true",
                          "apiPublicCidrs": '["0.0.0.0/0"]'})
    cluster = m.one("eks:index:Cluster").inputs
    entry = cluster["accessEntries"]["admin"]
    assert entry["principalArn"] == arn
    assert entry["accessPolicies"]["cluster-admin"]["policyArn"].endswith("AmazonEKSClusterAdminPolicy")
    assert cluster["endpointPublicAccess"] is False and "publicAccessCidrs" not in cluster


SSO_ROLE = "AWSReservedSSO_AdministratorAccess_0123456789abcdef"
TEAM = "arn:aws:iam::123456789012:role/platform-admins"
ALICE = "arn:aws:sts::123456789012:assumed-role/alice/s"
BOB = "arn:aws:sts::123456789012:assumed-role/bob/session"


def _entries(deployer: str, admin: str, role_path: str = "/", prior: RecordingMocks | None = None,
             preview: bool = False):
    mocks = RecordingMocks("us-west-2", deployer=deployer, role_path=role_path, prior=prior,
                           preview=preview)
    run_program(DEV, {"adminPrincipalArn": admin}, mocks=mocks)
    return mocks.one("eks:index:Cluster").inputs.get("accessEntries"), mocks


@pytest.mark.parametrize("deployer, role_path, admin", [
    # An SSO session: the issuer ARN carries the role's path, which users leave out.
    (f"arn:aws:sts::123456789012:assumed-role/{SSO_ROLE}/alice", "/aws-reserved/sso.amazonaws.com/",
     f"arn:aws:iam::123456789012:role/{SSO_ROLE}"),
    ("arn:aws:sts::123456789012:assumed-role/deployer/alice", "/", "arn:aws:iam::123456789012:role/deployer"),
    ("arn:aws:iam::123456789012:user/ci/deployer", "/", "arn:aws:iam::123456789012:user/deployer"),
])
def test_no_second_access_entry_for_the_creator(deployer, role_path, admin):
    """EKS already gave the cluster's creator an access entry (pulumi-eks always bootstraps it);
    another one for the same principal is a 409 ResourceInUseException (the mocks' EKS answers
    so). Compared by account, kind and name: an SSO role's issuer ARN has a path users leave
    out. A preview plans the same."""
    entries, first = _entries(deployer, admin, role_path)
    assert not entries
    assert not _entries(deployer, admin, role_path, preview=True)[0]
    again, _ = _entries(deployer, admin, role_path, prior=first)  # the next update
    assert not again


def test_access_entries_follow_the_cluster_not_the_current_deployer():
    """Alice created the cluster with adminPrincipalArn = her own role (no entry). Bob's later
    `pulumi up` must not plan an entry for Alice (409), and must plan the team's entry exactly
    as Alice's run did: the decision reads EKS's entries, not who runs the program."""
    alice = "arn:aws:iam::123456789012:role/alice"
    first, first_run = _entries(ALICE, alice)
    assert not first
    later, _ = _entries(BOB, alice, prior=first_run)
    assert not later  # the mocks' EKS would answer 409 to an entry for Alice
    team_first, team_run = _entries(ALICE, TEAM)
    team_later, _ = _entries(BOB, TEAM, prior=team_run)
    assert team_later == team_first and team_first["admin"]["principalArn"] == TEAM
    # Bob himself as admin on Alice's cluster: Bob has no entry yet, so he gets one.
    bob_entry, _ = _entries(BOB, "arn:aws:iam::123456789012:role/bob", prior=first_run)
    assert bob_entry["admin"]["principalArn"] == "arn:aws:iam::123456789012:role/bob"


def test_a_failed_first_update_does_not_lose_the_admin_entry():
    """Alice's first `pulumi up` failed after the cluster existed and before the team's entry
    did: the next run, whoever runs it, plans the team's entry."""
    _, failed = _entries(ALICE, TEAM)
    failed.clusters["ray-train-dev"].pop(TEAM)
    failed.own_entries["ray-train-dev"] = set()
    entries, _ = _entries(BOB, TEAM, prior=failed)
    assert entries["admin"]["principalArn"] == TEAM


def test_the_stack_reads_no_stack_reference(dev):
    """A StackReference to the stack itself fails on a DIY backend with the legacy layout, which
    refuses org/project/stack names (pulumi/pulumi#18569), and its outputs exist only after an
    update succeeded."""
    assert not dev.of_type("pulumi:pulumi:StackReference")
    assert "clusterCreatorArn" not in dev.exports


def _exec_args(kubeconfig: str) -> list[str]:
    return json.loads(kubeconfig)["users"][0]["user"]["exec"]["args"]


@pytest.mark.parametrize("overrides", [{}, {"existingClusterName": "shared-gpu"}],
                         ids=["own-cluster", "existing-cluster"])
def test_kubernetes_provider_authenticates_with_the_stack_profile(overrides):
    m = run_program(DEV, overrides, aws_config={"profile": "ml-platform"})
    providers = m.of_type("pulumi:providers:kubernetes")
    assert len(providers) == (2 if overrides else 1)  # k8s, and k8s-crds when adopting
    for provider in providers:
        config = provider.inputs["kubeconfig"]
        args = _exec_args(config.get("value") if isinstance(config, dict) else config)  # secret
        assert args[args.index("--profile") + 1] == "ml-platform"
    assert "--profile" not in _exec_args(m.exports["kubeconfig"])  # for people: their own creds
    assert "--profile" not in _exec_args(run_program(DEV, overrides).exports["kubeconfig"])


def test_node_roles_carry_only_node_policies(dev):
    attached = {r.inputs["policyArn"] for r in dev.of_type(
        "aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    assert attached == set(NODE_POLICY_ARNS)


def test_gpu_node_count_zero_keeps_the_whole_stack_and_no_gpu_node_can_start():
    # Idle GPU nodes now go on their own (scale from zero); gpuNodeCount 0 still deploys everything
    # else, with the cap EKS requires (max >= 1) and nothing that asks for it.
    paused = run_program(DEV, {"gpuNodeCount": "0"})
    scaling = paused.one(NODE_GROUP, "gpu").inputs["scalingConfig"]
    assert scaling == {"desiredSize": 0, "minSize": 0, "maxSize": 1}
    assert not paused.of_type("kubernetes:ray.io/v1:RayJob")  # a run needs GPU nodes
    running = run_program(DEV)
    # What a run brings: its RayJob and the Roles of its head, which name that RayJob.
    of_a_run = ("kubernetes:ray.io/v1:RayJob", "kubernetes:rbac.authorization.k8s.io/v1:")
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


@pytest.mark.parametrize("force, retained", [("false", True), ("true", False)])
def test_destroy_keeps_the_bucket_unless_told_to_empty_it(force, retained):
    m = run_program(DEV, {"forceDestroyBucket": force})
    assert m.one("aws:s3/bucket:Bucket").inputs["forceDestroy"] is (force == "true")
    for kept in ("ckpt-checkpoints", "ckpt-checkpoints-sse", "ckpt-checkpoints-private"):
        assert m.options[kept]["retainOnDelete"] is retained, kept  # kept encrypted and private


def test_bucket_is_private_encrypted_and_pods_reach_only_it(dev):
    assert dev.one("aws:s3/bucket:Bucket").inputs["forceDestroy"] is True  # dev stack setting
    pab = dev.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(pab[k] for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                "restrictPublicBuckets"))
    sse = dev.one("aws:s3/bucketServerSideEncryptionConfiguration:"
                  "BucketServerSideEncryptionConfiguration").inputs
    assert sse["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    policy = json.loads(dev.one("aws:iam/rolePolicy:RolePolicy", "ckpt").inputs["policy"])
    resources = {r for s in policy["Statement"] for r in [s["Resource"]]}
    assert resources == {"arn:aws:s3:::ckpt-checkpoints-bucket",
                         "arn:aws:s3:::ckpt-checkpoints-bucket/*"}
    assert all("*" not in a for s in policy["Statement"] for a in s["Action"])
    trust = json.loads(next(r for r in dev.of_type("aws:iam/role:Role")
                            if r.name == "ckpt-ray-pods").inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assoc = dev.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "ckpt").inputs
    assert (assoc["namespace"], assoc["serviceAccount"]) == ("ray", "ray-train")
    assert assoc["clusterName"] == "ray-train-dev"


def test_helm_releases_pinned_on_the_right_nodes_and_ordered(dev):
    releases = {r.inputs["chart"]: r for r in dev.of_type("kubernetes:helm.sh/v3:Release")}
    assert {c: r.inputs["version"] for c, r in releases.items()} == {
        "kuberay-operator": "1.7.0", "nvidia-device-plugin": "0.20.0",
        "aws-efa-k8s-device-plugin": "v0.5.30", "cluster-autoscaler": "9.59.0"}
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
    assert values["fullnameOverride"] == "cluster-autoscaler"  # the README's kubectl commands
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


def test_existing_cluster_mode_deploys_only_addons_and_workloads():
    m = run_program(DEV, {"existingClusterName": "shared-gpu"})
    types = {r.type for r in m.resources}
    assert not types & {"eks:index:Cluster", NODE_GROUP, "aws:ec2/vpc:Vpc"}
    assert len(m.of_type("kubernetes:helm.sh/v3:Release")) == 3
    assert not m.of_type("kubernetes:helm.sh/v3:Release", "cluster-autoscaler")
    assert m.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "ckpt").inputs[
        "clusterName"] == "shared-gpu"


def test_existing_cluster_adopts_kuberay_crds_that_are_already_there(dev):
    """pulumi-kubernetes >= 4.29 creates with a plain POST: an existing CRD is AlreadyExists
    unless the provider upserts, and its upsert (a server-side apply) conflicts with the fields
    Helm or kubectl own unless it forces them (await.go patchForce). Only the CRDs go through
    that provider."""
    m = run_program(DEV, {"existingClusterName": "shared-gpu"})
    upsert = m.one("pulumi:providers:kubernetes", "k8s-crds").inputs
    assert upsert["upsertExistingObjects"] in (True, "true")
    assert upsert["enablePatchForce"] in (True, "true")
    crds = [r.name for r in m.of_type("kubernetes:yaml/v2:ConfigGroup", "addons-crd-")]
    assert len(crds) == 3 and all(m.providers[c] == {"k8s-crds"} for c in crds)
    assert m.providers["addons-kuberay-operator"] == {"k8s"}
    # A cluster this stack creates has no CRDs yet: one provider, no upsert anywhere.
    assert not dev.of_type("pulumi:providers:kubernetes", "k8s-crds")


def test_destroying_a_stack_on_an_existing_cluster_leaves_the_shared_crds(dev):
    """Other RayJobs on a shared cluster live in KubeRay's CRDs: deleting a CRD deletes every
    object of its kind. Retain on delete is inherited by the group's CRDs (source_eval.go)."""
    m = run_program(DEV, {"existingClusterName": "shared-gpu"})
    for crd in m.of_type("kubernetes:yaml/v2:ConfigGroup", "addons-crd-"):
        assert m.options[crd.name]["retainOnDelete"] is True, crd.name
    for crd in dev.of_type("kubernetes:yaml/v2:ConfigGroup", "addons-crd-"):
        assert not dev.options[crd.name]["retainOnDelete"], crd.name  # the stack's own cluster


def test_a_cluster_that_runs_kuberay_gets_no_second_operator():
    """A second kuberay-operator release would create the ClusterRole `kuberay-operator`
    (the chart's fullnameOverride) again, and two operators would both reconcile the RayJob."""
    m = run_program(DEV, {"existingClusterName": "shared-gpu", "existingKuberay": "true"})
    assert not m.of_type("kubernetes:helm.sh/v3:Release", "kuberay")
    assert not m.of_type("kubernetes:yaml/v2:ConfigGroup", "addons-crd-")  # its CRDs: untouched
    assert not m.of_type("pulumi:providers:kubernetes", "k8s-crds")
    assert m.one("kubernetes:ray.io/v1:RayJob")  # served by the cluster's own operator


def test_stacks_on_one_existing_cluster_get_namespaces_of_their_own(dev):
    """Namespace, service account and Pod Identity association (one per namespace and service
    account in EKS) named per stack, so they collide neither with a `ray` namespace that is
    there nor with a second stack's; the stack's own cluster keeps `ray`."""
    seen = set()
    for name in ("team-a", "team-b"):
        m = run_program(DEV, {"existingClusterName": "shared-gpu", "clusterName": name})
        namespace = m.one("kubernetes:core/v1:Namespace").inputs["metadata"]["name"]
        assert namespace == f"ray-{name}" == m.exports["rayNamespace"]
        assoc = m.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "ckpt").inputs
        assert (assoc["namespace"], assoc["serviceAccount"]) == (namespace, "ray-train")
        namespaced = [r for r in m.resources if r.type.startswith("kubernetes:")
                      and "namespace" in (r.inputs.get("metadata") or {})]
        elsewhere = {(r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"])
                     for r in namespaced if r.inputs["metadata"]["namespace"] != namespace}
        # Only the head's Role (and its binding) on cluster-autoscaler's status, named for it.
        assert elsewhere == {("kube-system", f"{namespace}-head-autoscaler-status")}
        seen.add(namespace)
    assert len(seen) == 2
    assert dev.one("kubernetes:core/v1:Namespace").inputs["metadata"]["name"] == "ray"


def test_existing_cluster_node_selectors_are_configurable():
    m = run_program(DEV, {"existingClusterName": "shared-gpu",
                          "systemNodeSelector": json.dumps({"pool": "general"})},
                    mocks=_existing(system={"labels": {"pool": "general"}, "taints": []}))
    operator = m.one("kubernetes:helm.sh/v3:Release", "kuberay").inputs
    assert operator["values"]["nodeSelector"] == {"pool": "general"}


def _existing(**groups) -> RecordingMocks:
    mocks = RecordingMocks("us-west-2")
    mocks.existing_node_groups.update(groups)
    return mocks


def test_existing_cluster_that_lacks_labels_taint_or_pod_identity_fails_before_any_resource():
    from infra.existing import ExistingClusterError

    mocks = _existing(gpu={"labels": {"role": "gpu-worker", "nvidia.com/gpu.present": "true",
                                      "vpc.amazonaws.com/efa.present": "true"}, "taints": []},
                      system={"labels": {"team": "a"}, "taints": []})
    mocks.existing_addons.discard("eks-pod-identity-agent")
    with pytest.raises(ExistingClusterError) as error:
        run_program(DEV, {"existingClusterName": "shared-gpu"}, mocks=mocks)
    message = str(error.value)
    assert message.startswith("existingClusterName: shared-gpu is not ready")
    assert "no node group is labelled {'role': 'system'}" in message and "systemNodeSelector" in message
    assert "node group gpu lacks the taint nvidia.com/gpu=true:NoSchedule" in message
    assert "aws eks create-addon --cluster-name shared-gpu --addon-name eks-pod-identity-agent" in message
    assert "or install the agent otherwise" in message  # a self-managed agent is not an add-on
    assert mocks.resources == []


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
