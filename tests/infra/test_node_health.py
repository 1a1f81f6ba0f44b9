"""Node health under the mocks: the EKS node monitoring agent add-on (pinned, tagged, configured so
that its DCGM host engine runs on the tainted GPU nodes) and the node groups' auto repair (on by
default, off with gpuNodeAutoRepair, changed in place during a run, never declared on an existing
cluster's groups)."""

from __future__ import annotations

import json
import re

import pytest

from stack import catalog
from stack.config import ConfigError
from tests.infra.harness import run_program
from tests.infra.mocks import RecordingMocks
from tests.infra.test_program import DEV, NODE_GROUP
from tests.infra.test_tags import TAGS

ADDON = "aws:eks/addon:Addon"
AGENT = "eks-node-monitoring-agent"
GPU_GROUP = ("ray-train-dev", "ray-train-dev-gpu")
# EKS's node-group API spells a taint's effect NO_SCHEDULE, Kubernetes NoSchedule.
EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute",
           "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


def tolerates(toleration: dict, taint: dict) -> bool:
    """Kubernetes' Toleration.ToleratesTaint (k8s.io/api core/v1 toleration.go): an empty effect
    matches every effect, an empty key with Exists every key; Exists ignores the value, Equal
    (the default operator) needs it equal."""
    effect = EFFECTS.get(taint["effect"], taint["effect"])
    if toleration.get("effect") and toleration["effect"] != effect:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return toleration.get("key") == taint["key"] and toleration.get("value", "") == taint["value"]


def _agent(mocks: RecordingMocks) -> dict:
    (agent,) = [r.inputs for r in mocks.of_type(ADDON) if r.inputs["addonName"] == AGENT]
    return agent


def test_the_agent_is_pinned_per_kubernetes_release_and_tagged(dev):
    agent = _agent(dev)
    assert agent["addonVersion"] == catalog.KUBERNETES_RELEASES["1.35"].node_monitoring_agent
    assert TAGS.items() <= agent["tags"].items()
    assert agent["resolveConflictsOnCreate"] == agent["resolveConflictsOnUpdate"] == "OVERWRITE"
    assert "serviceAccountRoleArn" not in agent  # it calls no AWS API: no IAM role
    assert not [r for r in dev.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                if AGENT in r.name]
    assert dev.depends_on("eks-eks-node-monitoring-agent", "eks-system")
    for release in catalog.KUBERNETES_RELEASES.values():
        assert re.fullmatch(r"v\d+\.\d+\.\d+-eksbuild\.\d+", release.node_monitoring_agent)
    old = run_program(DEV, {"kubernetesVersion": "1.34"})
    assert _agent(old)["addonVersion"] == catalog.KUBERNETES_RELEASES["1.34"].node_monitoring_agent


def test_the_dcgm_host_engine_tolerates_the_gpu_nodes_taint(dev):
    """The agent sees the GPUs only through DCGM's nv-hostengine, which the add-on's dcgm-server
    DaemonSet runs with no tolerations unless configured (chart values.yaml dcgmAgent); the GPU
    nodes carry the taint, so without this it would never run there."""
    (gpu,) = [r.inputs for r in dev.of_type(NODE_GROUP) if r.name == "eks-gpu"]
    (taint,) = gpu["taints"]
    dcgm = json.loads(_agent(dev)["configurationValues"])["dcgmAgent"]["tolerations"]
    assert any(tolerates(t, taint) for t in dcgm)
    assert not tolerates({}, taint)  # the chart's default tolerates nothing: the check can fail


def test_eks_refuses_a_configuration_its_schema_does_not_allow():
    """The mocks' EKS validates configurationValues as CreateAddon does (additionalProperties
    false): the user guide's `monitoringAgent` spelling is not in the add-on's schema."""
    from tests.infra.mock_addons import check_configuration
    check_configuration(AGENT, json.dumps({"dcgmAgent": {"tolerations": [{"operator": "Exists"}]}}))
    for wrong, error in (({"monitoringAgent": {}}, r"\$\.monitoringAgent: is not defined"),
                         ({"dcgmAgent": {"toleration": []}}, r"\$\.dcgmAgent\.toleration"),
                         ({"dcgmAgent": {"tolerations": {}}}, "array of objects")):
        with pytest.raises(ValueError, match=r"InvalidParameterException.*" + error):
            check_configuration(AGENT, json.dumps(wrong))


def test_both_groups_have_auto_repair_by_default(dev):
    repair = {r.name: r.inputs["nodeRepairConfig"] for r in dev.of_type(NODE_GROUP)}
    assert repair == {"eks-system": {"enabled": True}, "eks-gpu": {"enabled": True}}
    assert dev.repair[GPU_GROUP] == {"enabled": True}  # what EKS holds after the create


def test_turning_repair_off_declares_it_off_and_eks_turns_it_off():
    """node_repair_config is Optional+Computed: a group declared without it would keep EKS's
    enabled=true; the key must send enabled=false."""
    first = run_program(DEV)
    later = run_program(DEV, {"gpuNodeAutoRepair": "false"},
                        mocks=RecordingMocks("us-west-2", prior=first))
    assert later.one(NODE_GROUP, "gpu").inputs["nodeRepairConfig"] == {"enabled": False}
    assert later.one(NODE_GROUP, "system").inputs["nodeRepairConfig"] == {"enabled": True}
    assert later.repair[GPU_GROUP] == {"enabled": False}
    assert later.repair_sent == [{"enabled": False}]
    assert _agent(later)  # the agent stays: its conditions and events still say what is wrong


@pytest.mark.parametrize("before, after", [("true", "false"), ("false", "true")])
def test_toggling_repair_during_a_run_updates_the_group_in_place(before, after):
    """Not ForceNew (node_group.go: UpdateNodegroupConfig): not refused while the run holds its
    nodes, no roll, no scaling block, the nodes stay."""
    first = run_program(DEV, {"gpuNodeAutoRepair": before})
    first.scaling[GPU_GROUP]["desiredSize"] = 2  # a run holds two GPU nodes
    later = run_program(DEV, {"gpuNodeAutoRepair": after},
                        mocks=RecordingMocks("us-west-2", prior=first))
    assert later.repair_sent == [{"enabled": after == "true"}]
    assert later.rolls == [] and later.scaling_sent == []
    assert later.scaling[GPU_GROUP]["desiredSize"] == 2


def test_an_existing_cluster_gets_neither_the_agent_nor_repair_settings():
    """Its node groups and add-ons are not this stack's: it declares none of them (its owner
    enables repair and the agent: docs/node-health.md)."""
    m = run_program(DEV, {"existingClusterName": "shared-gpu"})
    assert not m.of_type(NODE_GROUP)
    assert not [r for r in m.of_type(ADDON) if r.inputs["addonName"] == AGENT]
    assert m.repair == {} and m.repair_sent == []


def test_turning_repair_off_on_an_existing_cluster_is_refused_as_a_no_op():
    mocks = RecordingMocks("us-west-2")
    with pytest.raises(ConfigError, match=r"gpuNodeAutoRepair: false does nothing with "
                                          r"existingClusterName.*update-nodegroup-config"):
        run_program(DEV, {"existingClusterName": "shared-gpu", "gpuNodeAutoRepair": "false"},
                    mocks=mocks)
    assert mocks.resources == []
