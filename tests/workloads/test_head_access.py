"""The run's head for the cold start: what it may do in the Kubernetes API (least scope), what it
knows (its RayJob, the GPU node's price), and the scale-up watch beside it, in a RayJob that
still validates strictly against the KubeRay 1.7.0 CRD."""

from __future__ import annotations

import shlex

import pytest

from stack.catalog import ESTIMATE_REGION, PRICES_USD_PER_HOUR
from tests.conftest import KUBERAY_CRDS, REPO, need
from tests.workloads.crd_schema import load_schema, rayjob_rules, validate
from tests.workloads.test_manifests import S3, stack
from training.head.cold_start import PRICE_ENV, RAYJOB_ENV
from workloads.code_bundle import bundle
from workloads.rayjob import build_rayjob
from workloads.rbac import head_rbac

READ = {"get", "list"}


@pytest.fixture(scope="module")
def code():
    return bundle(REPO)


@pytest.fixture(scope="module")
def schema():
    return load_schema(need(KUBERAY_CRDS / "ray.io_rayjobs.yaml"))


def rules_by_scope(objs: list[dict]) -> dict:
    return {(o["kind"], o["metadata"].get("namespace")): o["rules"] for o in objs
            if o["kind"] in ("Role", "ClusterRole")}


def test_the_head_may_read_pods_events_nodes_and_one_configmap_and_change_only_its_rayjob():
    scopes = rules_by_scope(head_rbac("ray", "ray-train-dev-f44c3b4189", True))
    assert set(scopes) == {("Role", "ray"), ("Role", "kube-system"), ("ClusterRole", None)}
    for rules in scopes.values():
        for r in rules:
            assert "*" not in r["verbs"] + r["resources"] + r["apiGroups"], r
            writes = set(r["verbs"]) - READ
            assert not writes or (writes == {"patch"} and r["resources"] == ["rayjobs"]
                                  and r["resourceNames"] == ["ray-train-dev-f44c3b4189"]), r
    # Nodes are cluster-scoped: a ClusterRole, and only `get` (by name: the pods' nodeName).
    assert scopes[("ClusterRole", None)] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert scopes[("Role", "kube-system")] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
         "resourceNames": ["cluster-autoscaler-status"]}]


def test_without_ending_runs_the_head_changes_nothing():
    for rules in rules_by_scope(head_rbac("ray", "ray-train-dev-f44c3b4189", False)).values():
        assert all(set(r["verbs"]) <= READ for r in rules)


def test_every_role_is_bound_to_the_service_account_of_the_head_pod(code):
    job = build_rayjob(stack(), code, S3)
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    objs = head_rbac(job["metadata"]["namespace"], job["metadata"]["name"], True)
    roles = {(o["kind"], o["metadata"]["name"]) for o in objs if "rules" in o}
    bound = set()
    for b in (o for o in objs if o["kind"].endswith("Binding")):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": head["serviceAccountName"],
                                  "namespace": job["metadata"]["namespace"]}]
        assert b["metadata"].get("namespace") == next(
            o["metadata"].get("namespace") for o in objs
            if o["kind"] == b["roleRef"]["kind"] and o["metadata"]["name"] == b["roleRef"]["name"])
        bound.add((b["roleRef"]["kind"], b["roleRef"]["name"]))
    assert bound == roles


@pytest.mark.parametrize("end", ["true", "false"])
def test_the_head_knows_its_rayjob_and_price_and_runs_the_watch(code, schema, end):
    cfg = stack(endOnScaleUpFailure=end)
    job = build_rayjob(cfg, code, S3)
    assert validate(job, schema) == []
    assert rayjob_rules(job) == []
    pod = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    ray, watch = pod["containers"]
    assert ray["name"] == "ray-head"  # KubeRay runs Ray in the first container
    for c in (ray, watch):
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env[RAYJOB_ENV] == job["metadata"]["name"]
        prices = PRICES_USD_PER_HOUR.get(cfg.region, PRICES_USD_PER_HOUR[ESTIMATE_REGION])
        assert float(env[PRICE_ENV]) == prices[cfg.gpu_instance_type]
    assert watch["command"][:3] == ["python", "-m", "training.head.scaleup"]
    flag = "--end-on-scaleup-failure" if end == "true" else "--no-end-on-scaleup-failure"
    assert flag in watch["command"] and "--stay" in watch["command"]
    assert watch["resources"]["requests"] == watch["resources"]["limits"]  # Guaranteed QoS
    # The watch runs the shipped code: the same ConfigMap items the submitter mounts.
    code_volume = next(v for v in pod["volumes"] if v["name"] == "code")
    assert code_volume["configMap"]["items"] == code.items
    assert watch["workingDir"] == watch["volumeMounts"][0]["mountPath"]


def test_the_job_is_not_given_the_watch(code):
    """The entrypoint is unchanged: the watch is the head's, not the training job's."""
    job = build_rayjob(stack(), code, S3)
    assert "scaleup" not in " ".join(shlex.split(job["spec"]["entrypoint"]))
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert [c["name"] for c in workers["containers"]] == ["ray-worker"]


def test_stacks_sharing_a_cluster_get_roles_of_their_own(code):
    """On an existing cluster each stack has its namespace; what lies outside it (the status
    Role in kube-system, the node ClusterRole) carries the namespace in its name."""
    own = head_rbac("ray", "a", True)
    cfg = stack(existingClusterName="shared-gpu")
    shared = head_rbac(cfg.namespace, "b", True)
    assert cfg.namespace != "ray"
    names = lambda objs: {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
                          for o in objs}
    assert not names(own) & names(shared)
    assert {b["subjects"][0]["namespace"] for b in shared if "subjects" in b} == {cfg.namespace}
