"""The mock harness refuses what the engine and a multi-language component would break on."""

from __future__ import annotations

import asyncio
import gc

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pytest

from tests.infra.harness import REFUSED, quiet_refusals, run_program
from tests.infra.mocks import RecordingMocks
from tests.infra.plain_inputs import PlainInputError, plain_inputs
from tests.infra.test_program import DEV
from tests.stack.stacks import PROJECT


def test_plain_inputs_come_from_the_sdk_signatures():
    """pulumi-eks's schema marks these plain; the SDK types them without pulumi.Input."""
    cluster = plain_inputs("eks:index:Cluster")
    assert {"accessEntries", "authenticationMode", "skipDefaultNodeGroup",
            "corednsAddonOptions", "nodeAssociatePublicIpAddress"} <= cluster
    assert not {"vpcId", "privateSubnetIds", "tags", "version"} & cluster
    node_group = plain_inputs("eks:index:ManagedNodeGroup")
    assert {"enableEfaSupport", "kubeletExtraArgs", "ignoreScalingChanges"} <= node_group
    assert not {"nodeGroupName", "scalingConfig", "clusterName"} & node_group


def _cluster(**inputs):
    def program():
        vpc = aws.ec2.Vpc("vpc", cidr_block="10.0.0.0/16")
        eks.Cluster("c", vpc_id=vpc.id, skip_default_node_group=True,
                    authentication_mode=eks.AuthenticationMode.API,
                    **{k: v(vpc) for k, v in inputs.items()})
    return run_program(DEV, entry=program)


def test_an_output_in_a_plain_input_of_a_remote_component_is_refused():
    entries = {"admin": {"principal_arn": "arn:aws:iam::123456789012:role/team"}}
    with pytest.raises(PlainInputError, match="eks:index:Cluster c: accessEntries got an Output"):
        _cluster(access_entries=lambda vpc: vpc.id.apply(lambda _: entries))
    with pytest.raises(PlainInputError, match=r"accessEntries\.admin got an Output"):
        _cluster(access_entries=lambda vpc: {"admin": vpc.id.apply(lambda _: entries["admin"])})
    # Outputs where the component takes an Input, plain values in plain inputs: accepted, and the
    # component sees the resolved values.
    m = _cluster(access_entries=lambda vpc: {"admin": eks.AccessEntryArgs(
        principal_arn=vpc.id.apply(lambda _: "arn:aws:iam::123456789012:role/team"))})
    assert m.one("eks:index:Cluster").inputs["vpcId"] == "vpc-id"
    assert m.one("eks:index:Cluster").inputs["accessEntries"]["admin"]["principalArn"] == \
        "arn:aws:iam::123456789012:role/team"


def test_only_copies_of_a_refusal_go_unreported(caplog):
    """The SDK sets a refused registration's error on every output future of the resource;
    collected unretrieved, those copies report nothing (the test got the error), while any other
    unretrieved exception is still reported."""
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(quiet_refusals)
    refused, other = ValueError("refused"), ValueError("a bug")
    setattr(refused, REFUSED, True)
    for error in (refused, other):
        future = loop.create_future()
        future.set_exception(error)
        del future
    gc.collect()
    loop.close()
    reported = [r.exc_info[1] for r in caplog.records if "never retrieved" in r.getMessage()]
    assert reported == [other]


def test_stack_reference_reads_like_the_engine():
    """The builtin provider answers {name, outputs, secretOutputNames}: this stack's outputs of
    its last update, none on the first."""
    seen = {}

    def program():
        ref = pulumi.StackReference(f"organization/{PROJECT}/dev")
        ref.get_output("answer").apply(lambda v: seen.setdefault(len(seen), v))
        pulumi.export("answer", 42)

    first = run_program(DEV, entry=program)
    run_program(DEV, entry=program, mocks=RecordingMocks("us-west-2", prior=first))
    assert seen == {0: None, 1: 42}


def test_preview_creates_nothing_and_leaves_computed_outputs_unknown():
    m = run_program(DEV, preview=True)
    assert m.of_type("eks:index:Cluster") and not m.clusters.keys() - {"shared-gpu"}
    assert m.exports["clusterName"] is None  # known only once the cluster exists
    assert m.exports["region"] == "us-west-2"
