"""Where the program's container images come from: the contract between the pull-through cache
that `infra/` creates and the image references that `workloads/` emits. Pulumi-free.

- Images on ECR Public (`public.ecr.aws/...`, the Ray Train image) are pulled through an ECR
  pull-through cache rule of the stack's own Region: a cached image is an ordinary private ECR
  image, whose layers come from S3 over the VPC's S3 gateway endpoint instead of from ECR Public's
  CloudFront front through the NAT gateway (ECR user guide, pull-through-cache; "Amazon ECR uses
  Amazon S3 to store your image layers", vpc-endpoints).
- The EFA device plugin comes from the Amazon EKS add-on registry of the stack's Region (the chart
  pins us-west-2's).

No other image of the program is on ECR Public: the charts' defaults are quay.io/kuberay/operator
(kuberay-operator values.yaml), nvcr.io/nvidia/k8s-device-plugin (NVIDIA's), and
registry.k8s.io/autoscaling/cluster-autoscaler (stack/catalog.py).
"""

from __future__ import annotations

import re

from stack.catalog import EKS_ADDON_REGISTRY_ACCOUNTS
from stack.kube import within

ECR_PUBLIC = "public.ecr.aws"
EFA_PLUGIN_REPOSITORY = "eks/aws-efa-k8s-device-plugin"
# CreatePullThroughCacheRule ecrRepositoryPrefix: 2 to 30 characters of
# (?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)* (ECR API reference).
CACHE_PREFIX_MAX = 30
_PREFIX = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")


def dns_suffix(region: str) -> str:
    """The Region's domain: China Regions' endpoints end in amazonaws.com.cn."""
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


def ecr_registry(account: str, region: str) -> str:
    """A private ECR registry's host."""
    return f"{account}.dkr.ecr.{region}.{dns_suffix(region)}"


def efa_plugin_repository(region: str) -> str:
    """The EFA device plugin image's repository in the Region's EKS add-on registry; KeyError for
    a Region the table lacks (stack/validation.py rejects such a Region first)."""
    return f"{ecr_registry(EKS_ADDON_REGISTRY_ACCOUNTS[region], region)}/{EFA_PLUGIN_REPOSITORY}"


def cache_prefix(cluster_name: str) -> str:
    """The cache rule's repository prefix: one per cluster (a registry holds one rule per prefix,
    and cluster names are unique per account and Region), within ECR's length and pattern."""
    prefix = within(re.sub(r"-{2,}", "-", cluster_name), CACHE_PREFIX_MAX, key=cluster_name)
    assert _PREFIX.match(prefix), prefix  # cluster names are DNS labels (stack/validation.py)
    return prefix


def cache_repository(account: str, region: str, prefix: str) -> str:
    """Where images pulled through the cache rule live: `<registry>/<prefix>`."""
    return f"{ecr_registry(account, region)}/{prefix}"


def through_cache(image: str, cache: str | None) -> str:
    """`image` as the nodes pull it: an ECR Public image through the cache repository `cache`
    (`public.ecr.aws/a/b:t` -> `<cache>/a/b:t`, tag or digest kept); any other image, or no
    cache, unchanged."""
    if cache is None or not image.startswith(f"{ECR_PUBLIC}/"):
        return image
    return f"{cache}/{image.removeprefix(f'{ECR_PUBLIC}/')}"
