"""The image path of a cold start: gp3 root volumes sized for pulls (and priced), nodeadm's
FastImagePull gate in MIME user data, the ECR pull-through cache, the EFA plugin's registry."""

from __future__ import annotations

import base64
import email
import json

import pytest
import yaml

from infra.image_cache import UNPULLED_DAYS, cache_lifecycle_policy
from infra.root_volumes import SYSTEM_ROOT, RootVolume, gpu_root
from infra.user_data import fast_image_pull_applies, node_user_data
from stack import catalog
from stack.catalog import InstanceFacts
from stack.config import ConfigError
from stack.parse import parse
from stack.images import cache_prefix, efa_plugin_repository, through_cache
from tests.infra.harness import run_program
from tests.infra.test_program import DEV, LT
from tests.stack.stacks import STACK_FILES, stack_name

RAYJOB = "kubernetes:ray.io/v1:RayJob"
RULE = "aws:ecr/pullThroughCacheRule:PullThroughCacheRule"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
TEMPLATE = "aws:ecr/repositoryCreationTemplate:RepositoryCreationTemplate"
CACHED_RAY = ("123456789012.dkr.ecr.us-west-2.amazonaws.com/ray-train-dev/"
              "deep-learning-containers/ray:train-ml-cuda-v1.1")


@pytest.fixture(scope="module")
def dev():
    return run_program(DEV)


def ebs(m, template: str) -> dict:
    return m.one(LT, template).inputs["blockDeviceMappings"][0]["ebs"]


def test_root_volumes_get_gp3_throughput_and_iops_for_image_pulls(dev):
    gpu, system = ebs(dev, "gpu-lt"), ebs(dev, "system-lt")
    assert (gpu["volumeType"], gpu["throughput"], gpu["iops"]) == ("gp3", 1000, 16000)
    assert gpu["volumeSize"] == 200 and gpu["encrypted"] == "true"
    # nodeadm's floor for FastImagePull on the always-on system node.
    assert (system["throughput"], system["iops"], system["volumeSize"]) == (600, 3000, 100)


def test_every_root_volume_is_one_ebs_accepts():
    for volume in (SYSTEM_ROOT, gpu_root(200)):
        assert volume.problems() == [], volume
    # 1000 MiB/s needs 4000 IOPS (0.25 MiB/s per IOPS); 16000 IOPS need 32 GiB.
    assert RootVolume(gib=100, throughput_mibps=1000, iops=3000).problems() == [
        "1000 MiB/s needs at least 4000 IOPS"]
    assert len(RootVolume(gib=20, throughput_mibps=125, iops=16000).problems()) == 1


def test_volume_performance_above_the_free_baseline_is_in_the_cost_outputs(dev):
    breakdown = dev.exports["hourlyCostBreakdown"]
    price = catalog.PRICES_USD_PER_HOUR["us-west-2"]
    per_gpu_node = 875 * price["gp3-mibps"] + 13000 * price["gp3-iops"]  # (1000-125), (16000-3000)
    assert breakdown["gpuRootVolumePerformanceDuringRun"] == pytest.approx(2 * per_gpu_node, abs=1e-4)
    assert breakdown["systemRootVolumePerformance"] == pytest.approx(
        475 * price["gp3-mibps"], abs=1e-4)
    assert dev.exports["idleCostUsdPerHour"] == pytest.approx(sum(
        v for k, v in breakdown.items() if not k.endswith("DuringRun")), abs=1e-3)


@pytest.mark.parametrize("template", ["gpu-lt", "system-lt"])
def test_user_data_is_mime_multipart_with_the_fast_image_pull_node_config(dev, template):
    """What EKS merges its own part into: a MIME multi-part archive whose nodeadm part turns the
    gate on and names no cluster (EKS's part does)."""
    text = base64.b64decode(dev.one(LT, template).inputs["userData"]).decode()
    message = email.message_from_string(text)
    assert message["MIME-Version"] == "1.0" and message.is_multipart()
    assert message.get_content_type() == "multipart/mixed" and not message.defects
    (part,) = message.get_payload()
    assert part.get_content_type() == "application/node.eks.aws"
    (config,) = list(yaml.safe_load_all(part.get_payload()))
    assert config == {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig",
                      "spec": {"featureGates": {"FastImagePull": True}}}


def test_no_fast_image_pull_where_nodeadm_would_ignore_it():
    """nodeadm's UseSOCISnapshotter: at least 4 vCPUs and 7 GiB."""
    assert not fast_image_pull_applies(InstanceFacts(vcpus=2, memory_gib=8))
    assert not fast_image_pull_applies(InstanceFacts(vcpus=4, memory_gib=4))
    assert node_user_data(InstanceFacts(vcpus=2, memory_gib=8)) is None
    assert all(fast_image_pull_applies(f) for f in catalog.INSTANCES.values())


def rayjob_images(m) -> set[str]:
    spec = m.one(RAYJOB).inputs["spec"]
    cluster = spec["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"], *[g["template"] for g in
                                                    cluster["workerGroupSpecs"]],
            spec["submitterPodTemplate"]]
    return {c["image"] for pod in pods for c in pod["spec"]["containers"]}


def test_the_ray_image_comes_through_the_stacks_pull_through_cache(dev):
    rule = dev.one(RULE).inputs
    assert rule == {"ecrRepositoryPrefix": "ray-train-dev", "upstreamRegistryUrl": "public.ecr.aws"}
    assert rayjob_images(dev) == {CACHED_RAY}
    # The RayJob is created only once the rule and the nodes' first-pull permissions exist.
    for policy in dev.of_type(ROLE_POLICY, "first-pull"):
        assert dev.depends_on("ray-rayjob", policy.name)
    assert dev.depends_on("ray-rayjob", "images-ecr-public")


@pytest.mark.parametrize("tags", [None, "{}"], ids=["tagged-stack", "untagged-stack"])
def test_both_node_roles_may_make_the_first_pull_and_nothing_more(tags):
    """The ECR user guide (pull-through-cache-iam): the puller that creates the repository needs
    ecr:BatchImportUpstreamImage and ecr:CreateRepository, and ecr:TagResource as well where the
    creation template adds resource tags (both committed stacks set tags)."""
    m = run_program(DEV, {} if tags is None else {"tags": tags})
    template = m.one(TEMPLATE).inputs
    needed = ["ecr:BatchImportUpstreamImage", "ecr:CreateRepository",
              *(["ecr:TagResource"] if template.get("resourceTags") else [])]
    assert bool(template.get("resourceTags")) == (tags is None)
    policies = m.of_type(ROLE_POLICY, "first-pull")
    assert {p.inputs["role"] for p in policies} == {"eks-system-node", "eks-gpu-node"}
    for p in policies:
        assert json.loads(p.inputs["policy"]) == {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": needed,
            "Resource": "arn:aws:ecr:us-west-2:123456789012:repository/ray-train-dev/*"}]}


def test_the_repositories_the_cache_creates_get_a_lifecycle_policy_and_the_stacks_tags(dev):
    """They are no stack resources (pulumi destroy leaves them): a creation template, applied
    for PULL_THROUGH_CACHE to the rule's prefix, bounds their storage from their creation on.
    Tags in a template need a role ECR assumes (repository-creation-templates-create-iam)."""
    template = dev.one(TEMPLATE).inputs
    assert (template["prefix"], template["appliedFors"]) == ("ray-train-dev",
                                                             ["PULL_THROUGH_CACHE"])
    assert json.loads(template["lifecyclePolicy"]) == cache_lifecycle_policy()
    (rule,) = cache_lifecycle_policy()["rules"]
    assert rule["selection"] == {"tagStatus": "any", "countType": "sinceImagePulled",
                                 "countUnit": "days", "countNumber": UNPULLED_DAYS}
    assert rule["action"] == {"type": "expire"}
    assert template["resourceTags"] == {"environment": "dev", "project": "eks-ray-train"}
    assert template["customRoleArn"] == "arn:aws:iam::123456789012:role/images-repository-creation"
    role = dev.one("aws:iam/role:Role", "repository-creation").inputs
    assert json.loads(role["assumeRolePolicy"])["Statement"][0]["Principal"] == {
        "Service": "ecr.amazonaws.com"}
    assert json.loads(dev.one(ROLE_POLICY, "repository-creation").inputs["policy"])[
        "Statement"] == [{"Effect": "Allow", "Action": ["ecr:CreateRepository", "ecr:TagResource"],
                          "Resource": "arn:aws:ecr:us-west-2:123456789012:repository/"
                                      "ray-train-dev/*"}]
    assert dev.depends_on("images-repositories", "images-repository-creation")
    assert dev.depends_on("ray-rayjob", "images-repositories")  # no first pull before it


def test_a_long_cluster_names_template_has_the_rules_hashed_prefix():
    name = "a" * 36
    m = run_program(DEV, {"clusterName": name})
    assert m.one(TEMPLATE).inputs["prefix"] == m.one(RULE).inputs["ecrRepositoryPrefix"] == \
        cache_prefix(name) != name


@pytest.mark.parametrize("overrides", [{"ecrPullThroughCache": "false"},
                                       {"existingClusterName": "shared-gpu"}],
                         ids=["switched-off", "existing-cluster"])
def test_without_the_cache_the_image_comes_from_ecr_public(overrides):
    m = run_program(DEV, overrides)
    assert not m.of_type(RULE) and not m.of_type(ROLE_POLICY, "first-pull")
    assert not m.of_type(TEMPLATE)
    assert rayjob_images(m) == {catalog.RAY_IMAGE}


def test_only_ecr_public_images_are_rewritten_and_tags_or_digests_are_kept():
    cache = "1.dkr.ecr.eu-west-1.amazonaws.com/p"
    digest = "public.ecr.aws/a/b@sha256:" + "0" * 64
    assert through_cache(digest, cache) == f"{cache}/a/b@sha256:{'0' * 64}"
    assert through_cache("nvcr.io/nvidia/pytorch:25.01", cache) == "nvcr.io/nvidia/pytorch:25.01"
    assert through_cache(catalog.RAY_IMAGE, None) == catalog.RAY_IMAGE


@pytest.mark.parametrize("name", ["a" * 36, "ab--cd", "ray-train-dev"])
def test_cache_prefix_fits_ecrs_limits_for_any_cluster_name(name):
    prefix = cache_prefix(name)
    assert 2 <= len(prefix) <= 30 and "--" not in prefix
    assert cache_prefix(name) != cache_prefix(name[:-1] + "x")  # one rule per cluster


def test_ecr_pull_through_cache_key_is_validated():
    with pytest.raises(ConfigError) as e:
        parse({"ecrPullThroughCache": "yes"}, "us-west-2")
    assert any(p.startswith("ecrPullThroughCache:") for p in e.value.problems)


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
def test_efa_plugin_image_comes_from_the_stacks_own_region(path):
    m = run_program(path)
    release = m.one("kubernetes:helm.sh/v3:Release", "aws-efa-k8s-device-plugin").inputs
    assert release["values"]["image"] == {
        "repository": f"602401143452.dkr.ecr.{m.region}.amazonaws.com/eks/aws-efa-k8s-device-plugin"}


def test_efa_plugin_registry_follows_the_regions_own_account():
    assert efa_plugin_repository("af-south-1").startswith("877085696533.dkr.ecr.af-south-1.")
    assert efa_plugin_repository("mx-central-1").startswith("730335286997.dkr.ecr.mx-central-1.")
    assert parse({}, "mx-central-1").region == "mx-central-1"
    assert efa_plugin_repository("cn-north-1") == (
        "918309763551.dkr.ecr.cn-north-1.amazonaws.com.cn/eks/aws-efa-k8s-device-plugin")
    with pytest.raises(ConfigError) as e:
        parse({}, "xx-nowhere-1")
    assert any("EKS_ADDON_REGISTRY_ACCOUNTS" in p for p in e.value.problems)
