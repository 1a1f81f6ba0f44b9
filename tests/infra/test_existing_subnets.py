"""A stack whose subnets exist but whose zones no Stash holds (deployed by a version of this
program before the Stash) keeps the zones of those subnets, whatever AWS offers today."""

from __future__ import annotations

from tests.infra.harness import run_program
from tests.infra.mocks import RecordingMocks
from tests.infra.test_program import DEV, _zones


def test_an_older_stack_keeps_the_zones_of_its_subnets():
    first = run_program(DEV, mocks=RecordingMocks("us-west-2", offering=["us-west-2c"]))
    assert _zones(first) == ["us-west-2c", "us-west-2a"]
    first.stashes.clear()  # the state of a version without the Stash: subnets, no kept zones
    wider = ["us-west-2a", "us-west-2b", "us-west-2c"]  # AWS's offerings changed since
    for preview in (True, False):
        later = run_program(DEV, mocks=RecordingMocks("us-west-2", wider, prior=first,
                                                      preview=preview))
        assert _zones(later) == ["us-west-2c", "us-west-2a"], preview
    assert later.stashes["net-zones"] == ["us-west-2c", "us-west-2a"]  # what the next one reads


def test_a_fresh_account_has_no_subnets_and_takes_the_choice():
    fresh = RecordingMocks("us-west-2", offering=["us-west-2b"])
    m = run_program(DEV, mocks=fresh)
    assert _zones(m) == ["us-west-2b", "us-west-2a"]
    reads = [args for token, args in m.calls if token == "aws:ec2/getVpcs:getVpcs"]
    assert reads and {f["name"] for f in reads[0]["filters"]} == {
        "tag:Name", "tag:kubernetes.io/cluster/ray-train-dev"}
