"""The stack's one typed configuration: `StackConfig`, what every layer reads, and the error that
lists every problem with it. Its parsing from the raw Pulumi config is stack/parse.py, its
semantic checks stack/validation.py (both import this module, which imports neither).

The GPU nodes' capacity type is held as its catalog record (`gpu_capacity`, a
stack.catalog.GpuCapacity), resolved once by the parser: the node group, the quota check, the cost
outputs and the scale-up watch read that record, never a spelling of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from stack import catalog
from stack.kube import NAMESPACE, kueue_release_name
from training.config import TrainConfig
from training.errors import ConfigError as JobConfigError

class ConfigError(JobConfigError):
    """Every problem with the stack config, each naming its key and the fix."""

    def __init__(self, problems: list[str]):
        super().__init__(problems, what="stack configuration")


@dataclass(frozen=True)
class Reservation:
    """A capacity reservation or Capacity Block: its id and how many instances it holds."""

    id: str
    instance_count: int


@dataclass(frozen=True)
class StackConfig:
    """The validated stack. No defaults here: they come from Pulumi.yaml (stack/parse.py)."""

    name: str
    region: str
    kubernetes_version: str
    vpc_cidr: str
    system_instance_type: str
    system_node_count: int
    gpu_instance_type: str
    gpu_node_count: int
    gpu_availability_zone: str | None
    # What the GPU nodes are bought as: gpuCapacityType's record, or CAPACITY_BLOCK where the
    # stack sets capacityBlock (stack/parse.py resolves it).
    gpu_capacity: catalog.GpuCapacity
    capacity_reservation: Reservation | None
    capacity_block: Reservation | None
    image: str
    ray_version: str
    tags: Mapping[str, str]
    admin_principal_arn: str | None
    api_public_cidrs: tuple[str, ...]
    api_private_only: bool
    root_volume_gib: int
    # EKS node auto repair of the GPU node group (infra/node_health.py); the system group's is on.
    gpu_node_auto_repair: bool
    existing_cluster_name: str | None
    existing_kuberay: bool  # the existing cluster runs its own KubeRay operator
    existing_kueue: bool  # the existing cluster runs its own Kueue: queue objects only
    # Where the pods go: this stack's own node groups carry the defaults (stack/kube.py); on an
    # existing cluster, the labels its node groups carry.
    system_node_selector: Mapping[str, str]
    gpu_node_selector: Mapping[str, str]
    run_job: bool
    queue: bool  # Kueue admits every RayJob (workloads/kueue.py); false: they start at once
    strict_efa: bool
    force_destroy_bucket: bool
    data_buckets: tuple[str, ...]  # s3://bucket or s3://bucket/prefix/ the pods may read
    training: TrainConfig
    mlflow_tracking_uri: str | None  # http(s):// of a tracking server the pods can reach
    mlflow_tracking_username: str | None  # basic auth, with the secret mlflowTrackingPassword
    mlflow_tracking_password_set: bool  # the stack sets it (a secret: the program reads the value)
    extra_pip: tuple[str, ...]
    job_deadline_seconds: int
    ecr_pull_through_cache: bool
    end_on_scale_up_failure: bool

    @property
    def gpu(self) -> catalog.InstanceFacts:
        return catalog.INSTANCES[self.gpu_instance_type]

    @property
    def system(self) -> catalog.InstanceFacts:
        return catalog.INSTANCES[self.system_instance_type]

    @property
    def num_workers(self) -> int:
        return self.gpu_node_count * self.gpu.gpus

    @property
    def namespace(self) -> str:
        """The Ray workloads' namespace (their service account's Pod Identity association names
        it): `ray` on the stack's own cluster; on an existing one `ray-<clusterName>`, so that it
        collides neither with what is there nor with another stack on the same cluster."""
        return f"{NAMESPACE}-{self.name}" if self.existing_cluster_name else NAMESPACE

    @property
    def caches_images(self) -> bool:
        """ECR Public images come through this stack's pull-through cache: only on a cluster of
        its own, whose node roles the stack can allow the cache's first pull."""
        return self.ecr_pull_through_cache and self.existing_cluster_name is None

    @property
    def installs_kueue(self) -> bool:
        """The stack installs Kueue: the queue is on and no existing cluster's own serves it."""
        return self.queue and not self.existing_kueue

    @property
    def kueue_release(self) -> str | None:
        """The Kueue release's name: named for the stack on an existing cluster (stack/kube.py
        kueue_release_name); None (Pulumi's auto-name) on the stack's own cluster, where no
        other Kueue can be, so that an update never renames, and so replaces, an installed one
        (pulumi-kubernetes helm_release.go Diff: `.name` forces a new release)."""
        return kueue_release_name(self.name) if self.existing_cluster_name else None

    @property
    def spot(self) -> bool:
        return self.gpu_capacity is catalog.SPOT

    @property
    def reserved(self) -> Reservation | None:
        """The reservation the GPU nodes launch into, of either kind."""
        return self.capacity_reservation or self.capacity_block

