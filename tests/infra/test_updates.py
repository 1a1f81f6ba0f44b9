"""`pulumi preview` and `pulumi up`, first and later, on the engines and AWS answers users get:
the first preview and up on engines with and without invoke gating, the CLI version the program
needs, and what an update sends to a GPU node group that cluster-autoscaler resizes (access
entries across updates: test_access.py)."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pytest

from infra.engine import EngineVersionError
from infra.lookups import found
from stack.config import ConfigError
from tests.infra.harness import run_program
from tests.infra.mocks import RecordingMocks
from tests.infra.test_program import DEV, LT

GPU_GROUP = ("ray-train-dev", "ray-train-dev-gpu")
TEAM = "arn:aws:iam::123456789012:role/platform-admins"


@pytest.mark.parametrize("gates", [False, True], ids=["engine-3.217", "engine-3.256"])
def test_first_preview_and_first_up_pass_with_and_without_invoke_gating(gates):
    """Engines before 3.256.0 do not gate invokes on a component's children (pulumi SDK
    runtime/invoke.py: the fallback checks CustomResources only); the program reads the cluster
    from pulumi-eks's own output instead, unknown in the preview, known after the create. The
    next preview and up start from the first up's state."""
    preview = run_program(DEV, mocks=RecordingMocks("us-west-2", preview=True,
                                                    gates_invokes=gates))
    assert preview.exports["clusterName"] is None and preview.of_type(LT)
    up = run_program(DEV, mocks=RecordingMocks("us-west-2", gates_invokes=gates))
    assert up.exports["clusterName"] == "ray-train-dev"
    nic = up.one(LT, "gpu-lt").inputs["networkInterfaces"][0]
    assert nic["securityGroups"] == ["sg-eks-managed"]  # the EKS-managed group, from eksCluster
    assert '"server": "https://eks.example"' in up.exports["kubeconfig"]
    for preview in (True, False):
        later = run_program(DEV, mocks=RecordingMocks("us-west-2", prior=up, preview=preview,
                                                      gates_invokes=gates))
        assert later.one(LT, "gpu-lt").inputs["networkInterfaces"][0]["securityGroups"] == [
            "sg-eks-managed"]


def _read_after_the_component(seen: dict):
    def program():
        vpc = aws.ec2.Vpc("vpc", cidr_block="10.0.0.0/16")
        cluster = eks.Cluster("c", name="ray-train-dev", vpc_id=vpc.id,
                              skip_default_node_group=True,
                              authentication_mode=eks.AuthenticationMode.API)
        aws.eks.get_cluster_output(name="ray-train-dev", opts=pulumi.InvokeOutputOptions(
            depends_on=[cluster])).name.apply(lambda name: seen.setdefault("name", name))
    return program


def test_the_mock_engines_gate_a_read_after_a_remote_component_as_the_real_ones_do():
    """What the old program did: a gating engine answers unknown in a preview and runs the read
    once the cluster exists; an older one runs it at once, and on a fresh account it fails."""
    seen: dict = {}
    run_program(DEV, entry=_read_after_the_component(seen),
                mocks=RecordingMocks("us-west-2", preview=True))
    assert seen == {}  # unknown: the apply never ran
    run_program(DEV, entry=_read_after_the_component(seen), mocks=RecordingMocks("us-west-2"))
    assert seen == {"name": "ray-train-dev"}
    with pytest.raises(Exception, match=r"reading EKS Cluster \(ray-train-dev\): couldn't find "
                                        "resource"):
        run_program(DEV, entry=_read_after_the_component({}),
                    mocks=RecordingMocks("us-west-2", preview=True, gates_invokes=False))


def test_a_fresh_account_answers_every_eks_read_with_the_providers_not_found():
    """As the engine reports a provider's failed read (a gRPC error with the provider's text),
    which the program's `found` takes for "not there"."""
    errors = []

    def program():
        reads = [lambda: aws.eks.get_cluster(name="ray-train-dev"),
                 lambda: aws.eks.get_node_group(cluster_name="ray-train-dev",
                                                node_group_name="ray-train-dev-gpu"),
                 lambda: aws.eks.get_access_entry(cluster_name="ray-train-dev",
                                                  principal_arn=TEAM)]
        for read in reads:
            assert found(read) is None
            try:
                read()
            except Exception as error:  # noqa: BLE001 - the text is what is checked
                errors.append(str(error))

    run_program(DEV, entry=program)
    assert len(errors) == 3 and all("returned an error" in e and "couldn't find resource" in e
                                    for e in errors)
    assert "reading EKS Access Entry (ray-train-dev:" + TEAM in errors[2]


@pytest.mark.parametrize("version", ["3.216.0", "3.208.0", "3.187.0", None], ids=str)
def test_an_older_cli_stops_before_any_resource_naming_the_version_it_needs(version):
    """3.208.0 to 3.216.x keep Stash values but have no RequirePulumiVersion RPC: refused too."""
    mocks = RecordingMocks("us-west-2", cli_version=version)
    with pytest.raises(EngineVersionError, match=r"^Pulumi CLI 3\.217\.0 or newer is needed"):
        run_program(DEV, mocks=mocks)
    assert mocks.resources == []
    assert run_program(DEV, mocks=RecordingMocks("us-west-2", cli_version="3.217.0")).resources


def _update(prior: RecordingMocks, overrides: dict[str, str], autoscaler=None) -> RecordingMocks:
    mocks = RecordingMocks("us-west-2", prior=prior)
    mocks.autoscaler = autoscaler
    run_program(DEV, overrides, mocks=mocks)
    return mocks


def _ended(live: dict) -> None:
    live["desiredSize"] = 0  # cluster-autoscaler removed the idle nodes of a run that ended


def _started(live: dict) -> None:
    live["desiredSize"] = 2  # cluster-autoscaler added the nodes of a run that started


def test_a_run_that_ends_during_a_roll_gets_no_idle_nodes_back():
    """A launch-template change (a new root volume size) while a run holds 2 nodes: the provider
    rolls the group first; the run ends meanwhile. No scaling block may follow the roll."""
    first = run_program(DEV)
    first.scaling[GPU_GROUP]["desiredSize"] = 2
    later = _update(first, {"rootVolumeGib": "300"}, _ended)
    assert later.rolls == ["eks-gpu"] and later.scaling[GPU_GROUP]["desiredSize"] == 0
    assert later.scaling_sent == []


def test_a_run_that_starts_during_a_roll_keeps_its_nodes():
    """The state recorded 2 nodes (an update during an earlier run); the group is at 0 when the
    next launch-template change starts, and a run scales it to 2 during the roll."""
    first = run_program(DEV)
    first.scaling[GPU_GROUP]["desiredSize"] = 2
    during = _update(first, {"rootVolumeGib": "300"})
    assert during.node_group_state["eks-gpu"]["outputs"]["scalingConfig"]["desiredSize"] == 2
    during.scaling[GPU_GROUP]["desiredSize"] = 0
    later = _update(during, {"rootVolumeGib": "400"}, _started)
    assert later.rolls == ["eks-gpu"] and later.scaling[GPU_GROUP]["desiredSize"] == 2
    assert later.scaling_sent == []


def test_a_new_maximum_goes_out_only_while_the_group_is_at_zero_nodes():
    first = run_program(DEV)
    first.scaling[GPU_GROUP]["desiredSize"] = 2
    mocks = RecordingMocks("us-west-2", prior=first)
    with pytest.raises(ConfigError, match=r"gpuNodeCount: the node group ray-train-dev-gpu "
                                          r"holds 2 node\(s\) now; a new maximum \(2 -> 3\)"):
        run_program(DEV, {"gpuNodeCount": "3"}, mocks=mocks)
    assert mocks.resources == []
    first.scaling[GPU_GROUP]["desiredSize"] = 0
    later = _update(first, {"gpuNodeCount": "3", "rootVolumeGib": "300"})
    assert later.scaling_sent == [{"minSize": 0, "desiredSize": 0, "maxSize": 3}]
    assert later.one("aws:eks/nodeGroup:NodeGroup", "gpu").inputs["scalingConfig"]["maxSize"] == 3
    assert later.ignore_changes["eks-gpu"] == []
    assert _update(later, {"gpuNodeCount": "3"}).ignore_changes["eks-gpu"] == [
        "scalingConfig.desiredSize"]


@pytest.mark.parametrize("change, key", [
    ({"gpuCapacityType": "spot"}, r"gpuCapacityType \(ON_DEMAND -> SPOT\)"),
    ({"gpuInstanceType": "g6e.12xlarge"}, r"gpuInstanceType \(g6\.12xlarge -> g6e\.12xlarge\)"),
], ids=["capacity-type", "instance-type"])
def test_a_change_that_replaces_the_gpu_group_during_a_run_is_refused(change, key):
    """capacity_type and instance_types are ForceNew (terraform-provider-aws node_group.go): the
    group would be deleted, with the run's nodes, before its replacement exists. Refused before
    any resource while the group holds nodes; the same change at 0 nodes goes out."""
    first = run_program(DEV)
    first.scaling[GPU_GROUP]["desiredSize"] = 2  # a run holds two GPU nodes
    mocks = RecordingMocks("us-west-2", prior=first)
    with pytest.raises(ConfigError, match=key + r": replaces the node group ray-train-dev-gpu"
                       r".*holds 2 node\(s\).*`python -m runs list` names the run holding "
                       r"them, `python -m runs cancel NAME` ends it"):
        run_program(DEV, change, mocks=mocks)
    assert mocks.resources == []
    first.scaling[GPU_GROUP]["desiredSize"] = 0
    assert _update(first, change).one("aws:eks/nodeGroup:NodeGroup", "gpu").inputs[
        "instanceTypes"] == [change.get("gpuInstanceType", "g6.12xlarge")]
    # During the run, a change that replaces nothing (a new root volume) still goes out.
    first.scaling[GPU_GROUP]["desiredSize"] = 2
    assert _update(first, {"rootVolumeGib": "300"}).rolls == ["eks-gpu"]


def test_the_refusal_names_the_run_on_a_stack_without_its_own_run():
    """On a `runJob: false` stack the nodes are held by a submitted run and the rayJob output is
    empty: the refusal points at the tool that lists every run and ends one by name."""
    first = run_program(DEV, {"runJob": "false"})
    first.scaling[GPU_GROUP]["desiredSize"] = 2  # a submitted run holds two GPU nodes
    mocks = RecordingMocks("us-west-2", prior=first)
    with pytest.raises(ConfigError) as refused:
        run_program(DEV, {"runJob": "false", "gpuCapacityType": "spot"}, mocks=mocks)
    assert "`python -m runs cancel NAME` ends it" in str(refused.value)
    assert "rayJob" not in str(refused.value)
