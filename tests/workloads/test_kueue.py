"""Kueue's objects: valid under Kueue 0.19.2's strict CRDs (v1beta2, ../shared), the ClusterQueue
sized from the stack so that one run is admitted and a second waits, and the Pulumi wiring
(the chart, the order on destroy)."""

from __future__ import annotations

import copy

import pytest

from stack.catalog import CHARTS
from tests.conftest import REPO, SHARED, need
from tests.infra.harness import run_program
from tests.stack.stacks import STACK_FILES, stack_name
from tests.workloads.crd_schema import load_schema, validate
from tests.workloads.test_manifests import S3, stack
from workloads.code_bundle import bundle
from workloads.kueue import COVERED, LOCAL_QUEUE, QUEUE_LABEL, cluster_queue, queue_objects
from workloads.rayjob import build_rayjob

KUEUE_CRDS = SHARED / "reference" / "kueue-v0.19.2"
PLURAL = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues",
          "LocalQueue": "localqueues"}
DEV = next(p for p in STACK_FILES if stack_name(p) == "dev")


def schema(kind: str) -> dict:
    return load_schema(need(KUEUE_CRDS / f"kueue.x-k8s.io_{PLURAL[kind]}.yaml"), "v1beta2")


def rules(objs: list[dict]) -> list[str]:
    """The ClusterQueue's CEL rule (`flavors.all(size(x.resources) == size(coveredResources))`,
    its maxItems 16) beside what Kueue's webhook and scheduler need: each flavor's resources in
    coveredResources' order, every flavor and the LocalQueue's ClusterQueue existing."""
    flavors = {o["metadata"]["name"] for o in objs if o["kind"] == "ResourceFlavor"}
    queues = {o["metadata"]["name"] for o in objs if o["kind"] == "ClusterQueue"}
    errors = []
    for cq in (o for o in objs if o["kind"] == "ClusterQueue"):
        for group in cq["spec"]["resourceGroups"]:
            for f in group["flavors"]:
                if [r["name"] for r in f["resources"]] != group["coveredResources"]:
                    errors.append(f"{f['name']}: resources differ from coveredResources")
                if f["name"] not in flavors:
                    errors.append(f"{f['name']}: no such ResourceFlavor")
    errors += [f"LocalQueue {o['metadata']['name']}: no ClusterQueue {o['spec']['clusterQueue']}"
               for o in objs
               if o["kind"] == "LocalQueue" and o["spec"]["clusterQueue"] not in queues]
    return errors


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
@pytest.mark.parametrize("overrides",
                         [{}, {"gpuNodeCount": "1"}, {"gpuInstanceType": "g6.48xlarge"}],
                         ids=["as-committed", "one-node", "g6.48xlarge"])
def test_every_queue_object_of_every_stack_validates_strictly(path, overrides):
    objs = queue_objects(stack(path, **overrides))
    assert [o["kind"] for o in objs] == ["ResourceFlavor", "ResourceFlavor", "ClusterQueue",
                                         "LocalQueue"]
    for o in objs:
        assert o["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        assert validate(o, schema(o["kind"])) == [], o["kind"]
    assert rules(objs) == []


def test_the_validators_reject_a_typo_and_a_flavor_short_of_a_resource():
    objs = queue_objects(stack())
    cq = copy.deepcopy(objs[2])
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuotaa"] = "1"
    assert any("nominalQuotaa: unknown field" in e for e in validate(cq, schema("ClusterQueue")))
    short = copy.deepcopy(objs)
    short[2]["spec"]["resourceGroups"][0]["flavors"][1]["resources"].pop()
    assert rules(short) == [f"{short[2]['spec']['resourceGroups'][0]['flavors'][1]['name']}: "
                            "resources differ from coveredResources"]


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_the_gpu_quota_is_one_run_of_the_stack(nodes):
    cfg = stack(gpuNodeCount=str(nodes))
    gpu = cluster_queue(cfg)["spec"]["resourceGroups"][0]["flavors"][0]
    quota = {r["name"]: r["nominalQuota"] for r in gpu["resources"]}
    assert quota == {"cpu": str(nodes * 48), "memory": f"{nodes * 192}Gi",
                     "nvidia.com/gpu": str(nodes * 4), "vpc.amazonaws.com/efa": str(nodes)}


# --- Kueue's admission of the stack's RayJob, as pkg/controller/jobs/rayjob and the flavor
# assigner compute it: PodSets head, each worker group, submitter; a flavor fits a pod that
# selects its node labels and tolerates its taints.

def _quantity(text: str) -> float:
    for suffix, factor in (("Gi", 2**30), ("Mi", 2**20), ("m", 1e-3)):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    return float(text)


def podsets(job: dict) -> list[tuple[int, dict]]:
    spec = job["spec"]
    templates = [(1, spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"])]
    templates += [(g["replicas"], g["template"]["spec"])
                  for g in spec["rayClusterSpec"]["workerGroupSpecs"]]
    templates.append((1, spec["submitterPodTemplate"]["spec"]))
    return templates


def _fits(pod: dict, flavor: dict) -> bool:
    labels = flavor["spec"].get("nodeLabels", {})
    selected = all(pod.get("nodeSelector", {}).get(k) == v for k, v in labels.items())
    tolerated = all(any(t.get("key") == taint["key"] and t.get("effect") == taint["effect"]
                        for t in pod.get("tolerations", []))
                    for taint in flavor["spec"].get("nodeTaints", []))
    return selected and tolerated


def usage(jobs: list[dict], objs: list[dict]) -> dict[str, dict[str, float]]:
    """flavor -> resource -> what the admitted jobs take of it."""
    flavors = [o for o in objs if o["kind"] == "ResourceFlavor"]
    cq = next(o for o in objs if o["kind"] == "ClusterQueue")
    order = [f["name"] for f in cq["spec"]["resourceGroups"][0]["flavors"]]
    used = {name: {r: 0.0 for r in COVERED} for name in order}
    for job in jobs:
        for count, pod in podsets(job):
            flavor = next(n for n in order
                          if _fits(pod, next(f for f in flavors if f["metadata"]["name"] == n)))
            for c in [*pod["containers"], *pod.get("initContainers", [])]:
                for r, v in c.get("resources", {}).get("requests", {}).items():
                    assert r in COVERED, f"{r}: no resource group covers it (Kueue refuses)"
                    used[flavor][r] += count * _quantity(v)
    return used


def admitted(jobs: list[dict], objs: list[dict]) -> bool:
    cq = next(o for o in objs if o["kind"] == "ClusterQueue")
    quota = {f["name"]: {r["name"]: _quantity(r["nominalQuota"]) for r in f["resources"]}
             for f in cq["spec"]["resourceGroups"][0]["flavors"]}
    return all(used <= quota[f][r] for f, rs in usage(jobs, objs).items()
               for r, used in rs.items())


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
def test_one_run_is_admitted_and_a_second_waits(path):
    cfg = stack(path)
    job, objs = build_rayjob(cfg, bundle(REPO), S3), queue_objects(cfg)
    assert job["metadata"]["labels"][QUEUE_LABEL] == LOCAL_QUEUE == objs[-1]["metadata"]["name"]
    assert job["spec"]["suspend"] is True
    used = usage([job], objs)
    gpu, system = (o["metadata"]["name"] for o in objs[:2])
    assert used[gpu]["nvidia.com/gpu"] == cfg.gpu_node_count * cfg.gpu.gpus
    assert used[system]["nvidia.com/gpu"] == 0 and used[system]["cpu"] > 0  # head, submitter
    assert admitted([job], objs) and not admitted([job, job], objs)


def test_without_the_queue_the_rayjob_starts_at_once():
    job = build_rayjob(stack(queue="false"), bundle(REPO), S3)
    assert "suspend" not in job["spec"] and QUEUE_LABEL not in job["metadata"].get("labels", {})


@pytest.fixture(scope="module")
def dev():
    return run_program(DEV)


def test_the_stack_installs_kueue_from_its_oci_chart_on_the_system_node(dev):
    release = dev.one("kubernetes:helm.sh/v3:Release", "kueue").inputs
    assert release["chart"] == "oci://registry.k8s.io/kueue/charts/kueue" == CHARTS["kueue"].name
    assert release["version"] == "0.19.2" and "repositoryOpts" not in release
    assert release["values"]["controllerManager"]["nodeSelector"] == {"role": "system"}
    kinds = [r.type.rsplit(":", 1)[1] for r in dev.resources if "kueue.x-k8s.io" in r.type]
    assert sorted(kinds) == ["ClusterQueue", "LocalQueue", "ResourceFlavor", "ResourceFlavor"]


def test_destroy_deletes_the_namespace_and_its_submitted_runs_while_the_controllers_run(dev):
    """The engine deletes in reverse dependency order: the namespace (with every RayJob in it,
    the stack's or not) goes before KubeRay and Kueue, whose controllers drop the finalizers."""
    assert dev.depends_on("ray-ns", "addons-kuberay-operator")
    assert dev.depends_on("ray-ns", "addons-kueue")
    cq = next(r.name for r in dev.resources if r.type.endswith(":ClusterQueue"))
    lq = next(r.name for r in dev.resources if r.type.endswith(":LocalQueue"))
    assert dev.depends_on("ray-rayjob", lq) and dev.depends_on(lq, "ray-ns")
    assert not dev.depends_on(cq, "ray-ns")  # its finalizer waits for the namespace's workloads
