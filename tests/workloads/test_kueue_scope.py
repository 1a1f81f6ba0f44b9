"""Kueue scoped to the stack's RayJobs, read from the real chart (kubernetes-sigs/kueue v0.19.2
charts/kueue: values.yaml and templates/webhook/manifests.yaml in ../shared), rendered with our
values as Helm merges them over the chart's: which webhooks fail closed, and on what."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.conftest import SHARED, need
from tests.infra.harness import run_program
from tests.stack.stacks import STACK_FILES, stack_name
from tests.workloads.helm_template import render
from tests.workloads.test_manifests import stack
from workloads import helm_values

CHART = SHARED / "reference" / "kueue-v0.19.2"
DEV = next(p for p in STACK_FILES if stack_name(p) == "dev")
RELEASE_NS = "kueue-system"
KUEUE_GROUP = "kueue.x-k8s.io"


def chart_values() -> dict:
    return yaml.safe_load(need(CHART / "chart-values.yaml").read_text())


def coalesce(chart: dict, ours: dict) -> dict:
    """Helm's merge of user values over the chart's (pkg/chartutil coalesce): maps merged key by
    key, anything else replaced."""
    out = copy.deepcopy(chart)
    for key, value in ours.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = coalesce(out[key], value) if both else copy.deepcopy(value)
    return out


def webhooks(values: dict) -> list[dict]:
    text = render(need(CHART / "chart-webhook-manifests.yaml").read_text(), values,
                  {"Namespace": RELEASE_NS},
                  {"kueue.fullname": "kueue", "kueue.labels": "app.kubernetes.io/name: kueue"})
    return [w for doc in yaml.safe_load_all(text) for w in doc["webhooks"]]


def _selects(selector: dict | None, namespace: str) -> bool:
    """A namespaceSelector against a namespace's automatic kubernetes.io/metadata.name label."""
    if selector is None:
        return True
    labels = {"kubernetes.io/metadata.name": namespace}
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for e in selector.get("matchExpressions", []):
        inside = labels.get(e["key"]) in e["values"]
        ok = ok and (inside if e["operator"] == "In" else not inside)
    return ok


def fail_closed_on(hooks: list[dict], group: str, resource: str, namespace: str) -> list[str]:
    """The `failurePolicy: Fail` webhooks a create of `group/resource` in `namespace` goes
    through: while Kueue's pod is down, each refuses it."""
    return [w["name"] for w in hooks if w["failurePolicy"] == "Fail"
            and _selects(w.get("namespaceSelector"), namespace)
            and any(group in r["apiGroups"] and resource in r["resources"] for r in w["rules"])]


OTHERS = [("apps", "deployments"), ("", "pods"), ("apps", "statefulsets"), ("batch", "jobs"),
          ("apps", "daemonsets")]


def test_the_charts_defaults_fail_closed_on_every_pod_and_deployment():
    """What the values below change: with the chart's own, a Deployment in KubeRay's namespace
    goes through Kueue's webhooks, and none can be created while Kueue is down."""
    hooks = webhooks(chart_values())
    assert fail_closed_on(hooks, "apps", "deployments", "kuberay-system") == [
        "mdeployment.kb.io", "vdeployment.kb.io"]
    assert fail_closed_on(hooks, "", "pods", "ray") == ["mpod.kb.io", "vpod.kb.io"]


@pytest.mark.parametrize("overrides", [{}, {"existingClusterName": "shared-gpu"}],
                         ids=["own-cluster", "existing-cluster"])
def test_our_values_fail_closed_only_on_rayjobs_in_the_stacks_namespace(overrides):
    cfg = stack(**overrides)
    hooks = webhooks(coalesce(chart_values(), helm_values.kueue({"role": "system"},
                                                                cfg.namespace)))
    for namespace in ("kuberay-system", "kube-system", "nvidia-device-plugin", "default",
                      cfg.namespace):
        for group, resource in OTHERS:
            allowed = namespace == cfg.namespace and resource == "jobs"
            assert allowed or fail_closed_on(hooks, group, resource, namespace) == [], \
                (namespace, resource)
    assert fail_closed_on(hooks, "ray.io", "rayjobs", cfg.namespace) == [
        "mrayjob.kb.io", "vrayjob.kb.io"]
    assert fail_closed_on(hooks, "ray.io", "rayjobs", "team-b") == []  # another team's RayJobs
    by_name = {w["name"]: w for w in hooks}
    for kind in ("pod", "deployment", "statefulset"):
        assert by_name[f"m{kind}.kb.io"]["failurePolicy"] == "Ignore"
    scoped = {"matchLabels": {"kubernetes.io/metadata.name": cfg.namespace}}
    for w in hooks:
        if w["failurePolicy"] == "Fail":  # Kueue's own cluster-scoped objects, or our namespace
            rules_kueue = all(KUEUE_GROUP in r["apiGroups"] for r in w["rules"])
            assert rules_kueue or w["namespaceSelector"] == scoped, w["name"]


def test_our_manager_config_is_the_charts_but_for_integrations_and_namespaces():
    """A value for controllerManagerConfigYaml replaces the chart's whole text."""
    chart = yaml.safe_load(chart_values()["managerConfig"]["controllerManagerConfigYaml"])
    ours = yaml.safe_load(helm_values.kueue({}, "ray")["managerConfig"][
        "controllerManagerConfigYaml"])
    assert ours["integrations"] == {"frameworks": ["ray.io/rayjob"]}
    assert "ray.io/rayjob" in chart["integrations"]["frameworks"]
    for changed in ("integrations", "managedJobsNamespaceSelector"):
        ours.pop(changed)
        chart.pop(changed, None)
    assert ours == chart


@pytest.fixture(scope="module")
def dev():
    return run_program(DEV)


def test_the_release_carries_the_scoped_values_and_starts_after_kuberay(dev):
    """KubeRay's objects are never created while Kueue's webhooks are registered but not yet
    serving: Kueue's release waits for KubeRay's (whose CRDs its RayJob integration reads)."""
    values = dev.one("kubernetes:helm.sh/v3:Release", "kueue").inputs["values"]
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config["managedJobsNamespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "ray"}}
    assert dev.depends_on("addons-kueue", "addons-kuberay-operator")
    assert not dev.depends_on("addons-kuberay-operator", "addons-kueue")


def test_an_existing_clusters_own_kueue_gets_only_the_stacks_queue_objects():
    """existingKueue: no second release (its CRDs and webhooks are cluster-wide: Helm would
    refuse them as another release's), the flavors and ClusterQueue named for the stack."""
    m = run_program(DEV, {"existingClusterName": "shared-gpu", "existingKueue": "true"})
    assert not m.of_type("kubernetes:helm.sh/v3:Release", "kueue")
    queue = {r.type.rsplit(":", 1)[1]: r.inputs for r in m.resources
             if "kueue.x-k8s.io" in r.type}
    assert queue["ClusterQueue"]["metadata"]["name"] == "ray-train-dev-runs"
    assert queue["LocalQueue"]["metadata"]["namespace"] == "ray-ray-train-dev"
    job = m.one("kubernetes:ray.io/v1:RayJob").inputs
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "runs"
    # Without the key the stack installs its own, scoped to its namespace.
    own = run_program(DEV, {"existingClusterName": "shared-gpu"})
    values = own.one("kubernetes:helm.sh/v3:Release", "kueue").inputs["values"]
    assert "ray-ray-train-dev" in values["managerConfig"]["controllerManagerConfigYaml"]
