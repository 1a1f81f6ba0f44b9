"""An existing cluster that already runs Kueue is refused before any resource unless the stack
uses it (existingKueue: true): the decision from the CRD as Helm stamps it, the read against a
fake API server answering as the API server does (the CRD, or a 404), and the program under
mocks, in an update and in a preview."""

from __future__ import annotations

import base64
import copy
import logging

import pytest
import yaml
from kubernetes.client.rest import ApiException

from infra.existing_kueue import (KUEUE_CRD, ExistingKueueError, cluster_client,
                                  cluster_kueue_crd, foreign_kueue, read_crd)
from stack.kube import kueue_release_name
from tests.conftest import REPO, SHARED, need
from tests.infra.harness import run_program
from tests.infra.mocks import RecordingMocks
from tests.infra.test_program import DEV
from tests.training.kube_fake import TOKEN, FakeKube
from tests.workloads.test_manifests import stack

EXISTING = {"existingClusterName": "shared-gpu"}
KUEUE_NS = "kueue-system"
RELEASE = "kueue-ray-train-dev"  # the dev stack's clusterName is ray-train-dev
GET_CRD = ("get", "apiextensions.k8s.io", "customresourcedefinitions", None, KUEUE_CRD)


def kueue_crd() -> dict:
    """Kueue 0.19.2's ClusterQueue CRD as `kubectl apply` leaves it (no Helm metadata)."""
    return yaml.safe_load(need(SHARED / "reference/kueue-v0.19.2/kueue.x-k8s.io_clusterqueues.yaml")
                          .read_text())


def helm_installed(crd: dict, release: str, namespace: str = KUEUE_NS) -> dict:
    """`crd` as a Helm install leaves it: the label and annotations helm v3.20.2's install
    stamps on each object it creates (pkg/action/validate.go setMetadataVisitor)."""
    out = copy.deepcopy(crd)
    meta = out["metadata"]
    meta.setdefault("labels", {})["app.kubernetes.io/managed-by"] = "Helm"
    meta.setdefault("annotations", {}).update({"meta.helm.sh/release-name": release,
                                               "meta.helm.sh/release-namespace": namespace})
    return out


def test_the_stacks_release_on_an_existing_cluster_is_named_for_it():
    assert stack(**EXISTING).kueue_release == kueue_release_name("ray-train-dev") == RELEASE
    assert stack().kueue_release is None  # its own cluster: Pulumi's auto-name, as before
    long = kueue_release_name("a" * 36)
    assert len(long) == 28 and long != kueue_release_name("a" * 35 + "b")  # one per stack


@pytest.mark.parametrize("crd, owner", [
    (helm_installed(kueue_crd(), "kueue"), "Helm release kueue in kueue-system"),
    (kueue_crd(), "installed without Helm"),
    (helm_installed(kueue_crd(), "addons-kueue-1a2b3c4d"), "Helm release addons-kueue-1a2b3c4d"),
    (helm_installed(kueue_crd(), RELEASE, "other"), f"Helm release {RELEASE} in other"),
], ids=["another-release", "kubectl-apply", "another-stack", "our-name-elsewhere"])
def test_a_kueue_that_is_not_the_stacks_own_is_refused_in_one_line(crd, owner):
    problem = foreign_kueue(stack(**EXISTING), crd)
    assert problem.startswith("existingKueue: cluster shared-gpu already runs Kueue")
    assert owner in problem and "\n" not in problem
    assert "pulumi config set existingKueue true" in problem
    assert "namespace ray-ray-train-dev" in problem  # what that Kueue must manage


def test_the_refusal_docs_deploying_md_shows_is_the_programs():
    cfg = stack(**EXISTING, clusterName="team-a")
    line = foreign_kueue(cfg, helm_installed(kueue_crd(), "kueue"))
    assert line in (REPO / "docs" / "deploying.md").read_text().splitlines()


@pytest.mark.parametrize("overrides, crd", [
    (EXISTING, None),  # the API answered 404: no Kueue there
    (EXISTING, helm_installed(kueue_crd(), RELEASE)),  # this stack's earlier `pulumi up`
    ({**EXISTING, "existingKueue": "true"}, helm_installed(kueue_crd(), "kueue")),
    ({**EXISTING, "queue": "false"}, helm_installed(kueue_crd(), "kueue")),  # installs none
    ({}, helm_installed(kueue_crd(), "kueue")),  # its own cluster: nobody else's Kueue
], ids=["absent", "ours", "existingKueue", "no-queue", "own-cluster"])
def test_nothing_collides(overrides, crd):
    assert foreign_kueue(stack(**overrides), crd) is None


def test_the_read_is_the_crd_or_none_on_the_servers_404(tmp_path):
    installed = helm_installed(kueue_crd(), "kueue")
    with FakeKube({"customresourcedefinitions": [installed]}, None, tls_dir=tmp_path) as api:
        found = read_crd(_client(api))
    assert found == installed
    with FakeKube({"customresourcedefinitions": []}, None, tls_dir=tmp_path) as api:
        assert read_crd(_client(api)) is None
        assert api.requests == [GET_CRD]


def test_a_refused_read_raises_the_servers_answer(tmp_path):
    with FakeKube({"customresourcedefinitions": []}, [], tls_dir=tmp_path) as api:
        with pytest.raises(ApiException) as error:
            read_crd(_client(api))
    assert error.value.status == 403


def test_an_endpoint_that_cannot_be_reached_is_one_line(tmp_path, caplog):
    with FakeKube({"customresourcedefinitions": []}, None, tls_dir=tmp_path) as gone:
        url, ca = gone.url, _ca(gone)
    caplog.set_level(logging.DEBUG, logger="urllib3")
    with pytest.raises(ExistingKueueError) as error:
        cluster_kueue_crd("shared-gpu", url, ca, TOKEN)
    message = str(error.value)
    assert message.startswith(f"existingClusterName: cannot reach shared-gpu's API at {url}")
    assert "(NewConnectionError)" in message and "\n" not in message
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]  # one attempt


def _ca(api: FakeKube) -> str:
    """Its CA as EKS describes a cluster's (certificateAuthority.data: base64 PEM)."""
    return base64.b64encode(api.ca_file.read_bytes()).decode()


def _client(api: FakeKube):
    return cluster_client("shared-gpu", api.url, _ca(api), TOKEN)


def _with_crds(*crds: dict, preview: bool = False) -> RecordingMocks:
    mocks = RecordingMocks("us-west-2", preview=preview)
    mocks.cluster_crds = list(crds)
    return mocks


@pytest.mark.parametrize("preview", [False, True], ids=["up", "preview"])
def test_an_existing_cluster_with_kueue_is_refused_before_any_resource(preview):
    mocks = _with_crds(helm_installed(kueue_crd(), "kueue"), preview=preview)
    with pytest.raises(ExistingKueueError) as error:
        run_program(DEV, EXISTING, mocks=mocks)
    message = str(error.value)
    assert message.startswith("existingKueue:") and "\n" not in message
    assert mocks.resources == []  # not even the Kubernetes provider
    assert mocks.kube_requests == [GET_CRD]
    assert ("aws:eks/getClusterAuth:getClusterAuth", {"name": "shared-gpu"}) in mocks.calls


def test_the_stacks_own_kueue_passes_and_is_the_release_it_declares():
    """A second `pulumi up` of a stack that installed Kueue there: Helm's stamp names the
    release the program declares, so the read finds its own and the update goes on."""
    mocks = _with_crds(helm_installed(kueue_crd(), RELEASE))
    m = run_program(DEV, EXISTING, mocks=mocks)
    assert m.one("kubernetes:helm.sh/v3:Release", "kueue").inputs["name"] == RELEASE
    assert m.kube_requests == [GET_CRD]


def test_existing_kueue_true_uses_it_without_reading_the_cluster():
    mocks = _with_crds(helm_installed(kueue_crd(), "kueue"))
    m = run_program(DEV, {**EXISTING, "existingKueue": "true"}, mocks=mocks)
    assert not m.of_type("kubernetes:helm.sh/v3:Release", "kueue")
    assert m.one("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")
    assert m.kube_requests == []


def test_a_stack_that_owns_its_cluster_reads_no_cluster(dev):
    assert dev.one("kubernetes:helm.sh/v3:Release", "kueue").inputs.get("name") is None
    assert not [c for c, _ in dev.calls if c == "aws:eks/getClusterAuth:getClusterAuth"]


def test_an_api_that_refuses_the_read_stops_before_any_resource():
    mocks = _with_crds()
    mocks.cluster_rbac = []  # the deployer's access entry may read no CRD
    with pytest.raises(ExistingKueueError) as error:
        run_program(DEV, EXISTING, mocks=mocks)
    message = str(error.value)
    assert message.startswith("existingClusterName: shared-gpu's API answered HTTP 403")
    assert "existingKueue: true" in message and "\n" not in message
    assert mocks.resources == []
