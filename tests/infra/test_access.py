"""Who reaches the cluster under mocks: the admin access entry (never a second one for the
cluster's creator; decided from the cluster EKS holds, the stack's own entry known by its tag, so
that it never flips), the API endpoint, the kubeconfigs' profile."""

from __future__ import annotations

import json

import pytest

from tests.infra.harness import run_program
from tests.infra.mocks import RecordingMocks
from tests.infra.test_program import DEV


def test_admin_access_entry_and_private_endpoint():
    arn = "arn:aws:iam::123456789012:role/platform-admins"
    m = run_program(DEV, {"adminPrincipalArn": arn, "apiPrivateOnly": "true",
                          "apiPublicCidrs": '["0.0.0.0/0"]'})
    cluster = m.one("eks:index:Cluster").inputs
    entry = cluster["accessEntries"]["admin"]
    assert entry["principalArn"] == arn
    assert entry["accessPolicies"]["cluster-admin"]["policyArn"].endswith("AmazonEKSClusterAdminPolicy")
    assert cluster["endpointPublicAccess"] is False and "publicAccessCidrs" not in cluster


def _exec_args(kubeconfig: str) -> list[str]:
    return json.loads(kubeconfig)["users"][0]["user"]["exec"]["args"]


@pytest.mark.parametrize("overrides", [{}, {"existingClusterName": "shared-gpu"}],
                         ids=["own-cluster", "existing-cluster"])
def test_kubernetes_provider_authenticates_with_the_stack_profile(overrides):
    m = run_program(DEV, overrides, aws_config={"profile": "ml-platform"})
    providers = m.of_type("pulumi:providers:kubernetes")
    assert len(providers) == (2 if overrides else 1)  # k8s, and k8s-crds when adopting
    for provider in providers:
        config = provider.inputs["kubeconfig"]
        args = _exec_args(config.get("value") if isinstance(config, dict) else config)  # secret
        assert args[args.index("--profile") + 1] == "ml-platform"
    assert "--profile" not in _exec_args(m.exports["kubeconfig"])  # for people: their own creds
    assert "--profile" not in _exec_args(run_program(DEV, overrides).exports["kubeconfig"])


SSO_ROLE = "AWSReservedSSO_AdministratorAccess_0123456789abcdef"


TEAM = "arn:aws:iam::123456789012:role/platform-admins"


ALICE = "arn:aws:sts::123456789012:assumed-role/alice/s"


BOB = "arn:aws:sts::123456789012:assumed-role/bob/session"


def _entries(deployer: str, admin: str, role_path: str = "/", prior: RecordingMocks | None = None,
             preview: bool = False, **overrides: str):
    mocks = RecordingMocks("us-west-2", deployer=deployer, role_path=role_path, prior=prior,
                           preview=preview)
    run_program(DEV, {"adminPrincipalArn": admin, **overrides}, mocks=mocks)
    return mocks.one("eks:index:Cluster").inputs.get("accessEntries"), mocks


@pytest.mark.parametrize("deployer, role_path, admin", [
    # An SSO session: the issuer ARN carries the role's path, which users leave out.
    (f"arn:aws:sts::123456789012:assumed-role/{SSO_ROLE}/alice", "/aws-reserved/sso.amazonaws.com/",
     f"arn:aws:iam::123456789012:role/{SSO_ROLE}"),
    ("arn:aws:sts::123456789012:assumed-role/deployer/alice", "/", "arn:aws:iam::123456789012:role/deployer"),
    ("arn:aws:iam::123456789012:user/ci/deployer", "/", "arn:aws:iam::123456789012:user/deployer"),
])
def test_no_second_access_entry_for_the_creator(deployer, role_path, admin):
    """EKS already gave the cluster's creator an access entry (pulumi-eks always bootstraps it);
    another one for the same principal is a 409 ResourceInUseException (the mocks' EKS answers
    so). Compared by account, kind and name: an SSO role's issuer ARN has a path users leave
    out. A preview plans the same."""
    entries, first = _entries(deployer, admin, role_path)
    assert not entries
    assert not _entries(deployer, admin, role_path, preview=True)[0]
    again, _ = _entries(deployer, admin, role_path, prior=first)  # the next update
    assert not again


def test_access_entries_follow_the_cluster_not_the_current_deployer():
    """Alice created the cluster with adminPrincipalArn = her own role (no entry). Bob's later
    `pulumi up` must not plan an entry for Alice (409), and must plan the team's entry exactly
    as Alice's run did: the decision is the stack's, not who runs the program."""
    alice = "arn:aws:iam::123456789012:role/alice"
    first, first_run = _entries(ALICE, alice)
    assert not first
    later, _ = _entries(BOB, alice, prior=first_run)
    assert not later  # the mocks' EKS would answer 409 to an entry for Alice
    team_first, team_run = _entries(ALICE, TEAM)
    team_later, _ = _entries(BOB, TEAM, prior=team_run)
    assert team_later == team_first and team_first["admin"]["principalArn"] == TEAM
    # Bob himself as admin on Alice's cluster: Bob has no entry yet, so he gets one.
    bob_entry, _ = _entries(BOB, "arn:aws:iam::123456789012:role/bob", prior=first_run)
    assert bob_entry["admin"]["principalArn"] == "arn:aws:iam::123456789012:role/bob"


def test_a_failed_first_update_does_not_lose_the_admin_entry():
    """Alice's first `pulumi up` failed after the cluster existed and before the team's entry
    did: the next run, whoever runs it, plans the team's entry."""
    _, failed = _entries(ALICE, TEAM)
    failed.clusters["ray-train-dev"].pop(TEAM)
    failed.own_entries["ray-train-dev"] = set()
    entries, _ = _entries(BOB, TEAM, prior=failed)
    assert entries["admin"]["principalArn"] == TEAM


def test_the_stack_reads_no_stack_reference(dev):
    """A StackReference to the stack itself fails on a DIY backend with the legacy layout, which
    refuses org/project/stack names (pulumi/pulumi#18569), and its outputs exist only after an
    update succeeded."""
    assert not dev.of_type("pulumi:pulumi:StackReference")
    assert "clusterCreatorArn" not in dev.exports


def test_three_updates_and_a_teammates_plan_the_same_access_entries():
    """The provider's access-entry data source returns no tags (the mocks answer so), and EKS
    holds the creator's and the team's entries after the first update: every later update, by
    the creator or by a teammate with another role, declares the team's entry again, so Pulumi
    never deletes it (and its cluster-admin association)."""
    planned, mocks = [], None
    preview, _ = _entries(ALICE, TEAM, preview=True)
    for deployer in (ALICE, ALICE, ALICE, BOB):
        entries, mocks = _entries(deployer, TEAM, prior=mocks)
        planned.append(entries)
    assert preview == planned[0] and planned[0]["admin"]["principalArn"] == TEAM
    assert all(entries == planned[0] for entries in planned)
    assert set(mocks.clusters["ray-train-dev"]) == {"arn:aws:iam::123456789012:role/alice", TEAM}


def test_an_entry_the_principal_had_before_the_stack_saw_it_is_left_alone():
    """adminPrincipalArn set on a deployed stack, for a principal with an entry made by hand:
    not the stack's to declare (or to delete), on this update and the ones after."""
    oncall = "arn:aws:iam::123456789012:role/oncall"
    _, first = _entries(ALICE, TEAM)
    first.clusters["ray-train-dev"][oncall] = {}
    later, mocks = _entries(BOB, oncall, prior=first)
    assert not later and not _entries(ALICE, oncall, prior=mocks)[0]
    assert oncall in mocks.clusters["ray-train-dev"]


BOB_ROLE = "arn:aws:iam::123456789012:role/bob"
ALICE_ROLE = "arn:aws:iam::123456789012:role/alice"


def _cluster_gone(mocks: RecordingMocks, name: str = "ray-train-dev") -> RecordingMocks:
    """The cluster never got created (the update failed before it) or was deleted out of band:
    EKS holds neither it nor its entries."""
    mocks.clusters.pop(name, None)
    mocks.own_entries.pop(name, None)
    return mocks


def test_a_first_update_that_failed_before_the_cluster_is_decided_again():
    """Alice's first `pulumi up` (adminPrincipalArn = Bob) failed before the cluster existed;
    Bob then runs it and becomes the creator: an entry for Bob would be EKS's 409."""
    _, failed = _entries(ALICE, BOB_ROLE)
    entries, mocks = _entries(BOB, BOB_ROLE, prior=_cluster_gone(failed))
    assert not entries and set(mocks.clusters["ray-train-dev"]) == {BOB_ROLE}


@pytest.mark.parametrize("overrides", [{}, {"clusterName": "ray-train-dev2"}],
                         ids=["deleted-out-of-band", "renamed"])
def test_a_new_cluster_gets_the_decision_made_for_it(overrides):
    """Alice created the first cluster with adminPrincipalArn = her own role (no entry). The
    cluster is deleted, or clusterName changed; Bob's update creates the next one: Alice is no
    creator of it, so she gets her entry."""
    _, first = _entries(ALICE, ALICE_ROLE)
    entries, mocks = _entries(BOB, ALICE_ROLE, prior=_cluster_gone(first), **overrides)
    assert entries["admin"]["principalArn"] == ALICE_ROLE
    assert ALICE_ROLE in mocks.clusters[overrides.get("clusterName", "ray-train-dev")]


def test_an_upgrade_from_a_state_without_the_decision_keeps_the_admin_entry():
    """A stack an older version of this program created: its state holds the team's tagged
    entry and nothing else about it. The update under this version keeps declaring it."""
    _, old = _entries(ALICE, TEAM)
    old.stashes.clear()  # the older version kept no decision in the state
    entries, mocks = _entries(BOB, TEAM, prior=old)
    assert entries["admin"]["principalArn"] == TEAM
    assert TEAM in mocks.clusters["ray-train-dev"]
    read = mocks.one("aws:eks/accessEntry:AccessEntry")  # the resource Read, not a create
    assert mocks.clusters["ray-train-dev"][TEAM]["eks-ray-train/access-entry"] == "admin"
    assert read.inputs == {}
