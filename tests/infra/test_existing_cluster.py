"""An existing cluster under mocks: only add-ons and Ray workloads are deployed onto it, after
checking that it has what they need, in a namespace of the stack's own, leaving shared CRDs."""

from __future__ import annotations

import json

import pytest

from tests.infra.harness import run_program
from tests.infra.mocks import RecordingMocks
from tests.infra.test_program import DEV, NODE_GROUP


def test_existing_cluster_mode_deploys_only_addons_and_workloads():
    m = run_program(DEV, {"existingClusterName": "shared-gpu"})
    types = {r.type for r in m.resources}
    assert not types & {"eks:index:Cluster", NODE_GROUP, "aws:ec2/vpc:Vpc"}
    assert len(m.of_type("kubernetes:helm.sh/v3:Release")) == 4  # KubeRay, 2 plugins, Kueue
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
