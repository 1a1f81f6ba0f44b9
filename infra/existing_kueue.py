"""An existing cluster that already runs Kueue, refused before any resource unless the stack is
told to use it (`existingKueue: true`): Kueue's CRDs are chart templates, so a second install
fails on Helm's ownership check ("invalid ownership metadata"), and had it taken them over,
destroying this stack would delete every team's queues.

The read is the program's own, made before any resource, because Pulumi offers none that can
answer "absent":
- pulumi-kubernetes' provider serves three invokes, kubernetes:yaml:decode,
  kubernetes:helm:template and kubernetes:kustomize:directory (provider/pkg/provider/provider.go
  Invoke); none reads an object of the cluster.
- A resource read (`CustomResourceDefinition.get`) is a step of the update: the provider answers
  a 404 with no object (provider.go Read, deleteResponse) and the engine then fails the whole
  update with "resource '<id>' does not exist" (pulumi/pulumi pkg/resource/deploy/step.go
  ReadStep.Apply). It can demand that the CRD exist, never ask whether it does.
So the program reads the API itself, as it reads AWS (infra/lookups.py). The Python SDK runs a
plain invoke synchronously (sdk/python/lib/pulumi/runtime/invoke.py: `invoke` waits with
_sync_await), in a preview as in an update: the endpoint and CA (aws.eks.get_cluster) and a
token (aws.eks.get_cluster_auth: an STS GetCallerIdentity presigned with the AWS provider's own
credentials, the token `aws eks get-token` makes for the same profile: terraform-provider-aws
internal/service/eks/cluster_auth_data_source.go) are plain values before any resource exists.
The official `kubernetes` client then GETs the CRD, with no retries (runs/kube.py says why).

What is this stack's own: Helm takes over an existing object only when its label
app.kubernetes.io/managed-by is Helm and its annotations meta.helm.sh/release-name and
release-namespace name the release being installed (helm v3.20.2, which pulumi-kubernetes
embeds, pkg/action/validate.go checkOwnership), and an install stamps exactly those on every
object it creates (install.go, setMetadataVisitor). The chart's CRDs are templates
(charts/kueue/templates/crd/) of fixed names, as are its visibility APIServices: two
releases of other names collide on them. This stack's release on an existing cluster is named for it
(StackConfig.kueue_release), so its own earlier install passes and any other is refused."""

from __future__ import annotations

import json
from typing import Mapping

import pulumi_aws as aws
import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from infra.kubeconfig import kubeconfig_dict
from stack.catalog import CHARTS
from stack.config import StackConfig
from training.errors import InputError

KUEUE_CRD = "clusterqueues.kueue.x-k8s.io"  # every Kueue install has it (its ClusterQueues)
MANAGED_BY = "app.kubernetes.io/managed-by"
RELEASE_NAME = "meta.helm.sh/release-name"
RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"
TIMEOUT_S = (10, 30)  # connect, read


class ExistingKueueError(InputError):
    """The existing cluster's Kueue would collide with the one this stack installs."""


def looks_for_kueue(cfg: StackConfig) -> bool:
    """Only a stack that installs Kueue on a cluster it does not own can meet another's."""
    return bool(cfg.existing_cluster_name) and cfg.installs_kueue


def helm_owner(crd: Mapping) -> tuple[str, str] | None:
    """(release, namespace) of the Helm release that owns `crd`, as checkOwnership reads it;
    None when Helm does not manage it (kubectl apply, another tool)."""
    meta = crd.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if labels.get(MANAGED_BY) != "Helm" or not annotations.get(RELEASE_NAME):
        return None
    return annotations[RELEASE_NAME], annotations.get(RELEASE_NAMESPACE, "")


def foreign_kueue(cfg: StackConfig, crd: Mapping | None) -> str | None:
    """The one-line refusal when the cluster has Kueue's CRD (`crd`, as the API returned it;
    None: 404) and it is not this stack's own release's; None when nothing collides."""
    if crd is None or not looks_for_kueue(cfg):
        return None
    ours = (cfg.kueue_release, CHARTS["kueue"].namespace)
    owner = helm_owner(crd)
    if owner == ours:
        return None
    by = (f"Helm release {owner[0]} in {owner[1]}" if owner
          else "installed without Helm")
    return (f"existingKueue: cluster {cfg.existing_cluster_name} already runs Kueue (CRD "
            f"{KUEUE_CRD}, {by}); this stack would install a second one, which Helm refuses "
            "(invalid ownership metadata): set `pulumi config set existingKueue true` to queue "
            f"the runs in that Kueue (it must enable ray.io/rayjob and manage namespace "
            f"{cfg.namespace}), or `pulumi config set queue false`; nothing was created")


def read_crd(api: client.ApiClient, name: str = KUEUE_CRD) -> dict | None:
    """The CRD as the API server returns it (raw JSON: no client model to fail on fields it does
    not know), or None on its 404. Raises ApiException or a urllib3/OS error otherwise."""
    try:
        response = client.ApiextensionsV1Api(api).read_custom_resource_definition(
            name, _preload_content=False, _request_timeout=TIMEOUT_S)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return json.loads(response.data)


def cluster_client(name: str, endpoint: str, ca_data: str, token: str) -> client.ApiClient:
    """A client for the cluster as the Kubernetes provider's kubeconfig names it
    (infra/kubeconfig.py), with a bearer token in place of its exec credential; one attempt, no
    urllib3 retries."""
    conf = client.Configuration()
    conf.retries = 0
    return config.new_client_from_config_dict(
        kubeconfig_dict(name, endpoint, ca_data, {"token": token}), client_configuration=conf)


def cluster_kueue_crd(name: str, endpoint: str, ca_data: str, token: str) -> dict | None:
    """read_crd on cluster `name`; a refused or failed read is one ExistingKueueError line."""
    try:
        return read_crd(cluster_client(name, endpoint, ca_data, token))
    except ApiException as error:
        raise ExistingKueueError(
            f"existingClusterName: {name}'s API answered HTTP {error.status} {error.reason} to "
            f"reading CRD {KUEUE_CRD}: this stack installs Kueue there and must first see "
            "whether one runs; let the deployer's access entry read CRDs, or set existingKueue: "
            "true if the cluster runs Kueue") from None
    except (urllib3.exceptions.HTTPError, OSError) as error:
        why = getattr(error, "reason", None) or error  # MaxRetryError: what the attempt met
        raise ExistingKueueError(
            f"existingClusterName: cannot reach {name}'s API at {endpoint} to look for an "
            f"installed Kueue ({type(why).__name__}); run `pulumi up` where the endpoint is "
            "reachable (a private endpoint: from inside its VPC)") from None


def refuse_foreign_kueue(cfg: StackConfig, endpoint: str, ca_data: str) -> None:
    """Read the existing cluster's Kueue CRD when the stack would install Kueue there, and raise
    ExistingKueueError (one line) if it is another's or cannot be read."""
    if not looks_for_kueue(cfg):
        return
    name = cfg.existing_cluster_name
    token = aws.eks.get_cluster_auth(name=name).token
    problem = foreign_kueue(cfg, cluster_kueue_crd(name, endpoint, ca_data, token))
    if problem:
        raise ExistingKueueError(problem)
