"""The deployer's IAM policy (stack.deployer_policy) covers every AWS resource type and data
source the program uses, in each mode it runs in, and the committed document is the generated one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stack import deployer_policy
from tests.conftest import REPO
from tests.infra.harness import run_program
from tests.infra.mocks import RecordingMocks
from tests.infra.test_program import DEV
from tests.stack.stacks import STACK_FILES, stack_name

COMMITTED = REPO / "docs" / "deployer-policy.json"


def _used(m: RecordingMocks) -> tuple[set[str], set[str]]:
    return {r.type for r in m.resources}, {token for token, _ in m.calls}


def _runs():
    """Every stack file, a second update (reads its live subnets/node groups), an existing
    cluster, and data buckets: between them each branch that registers or invokes something."""
    for path in STACK_FILES:
        first = run_program(path)
        yield stack_name(path), first
        yield f"{stack_name(path)}-update", run_program(
            path, mocks=RecordingMocks(first.region, prior=first))
    yield "existing-cluster", run_program(DEV, {"existingClusterName": "shared-gpu"})
    for kind in ("role", "user"):  # an admin entry: IAM's own spelling of the principal
        admin = {"adminPrincipalArn": f"arn:aws:iam::123456789012:{kind}/platform-admins"}
        first = run_program(DEV, admin)
        yield f"admin-{kind}", first
        yield f"admin-{kind}-update", run_program(  # the cluster exists: its entries are read
            DEV, admin, mocks=RecordingMocks(first.region, prior=first))
    yield "data-buckets", run_program(DEV, {"dataBuckets": json.dumps(
        ["s3://corpus/chat/"])})


@pytest.fixture(scope="module")
def used() -> dict[str, tuple[set[str], set[str]]]:
    return {name: _used(m) for name, m in _runs()}


def test_every_resource_type_and_invoke_the_program_uses_is_covered(used):
    for name, (types, invokes) in used.items():
        missing = deployer_policy.uncovered(types, invokes)
        assert not missing.resources, f"{name}: no IAM actions for {missing.resources}"
        assert not missing.invokes, f"{name}: no IAM actions for {missing.invokes}"
    all_types = set().union(*(t for t, _ in used.values()))
    assert {"aws:ec2/vpc:Vpc", "eks:index:Cluster", "aws:iam/role:Role"} <= all_types


def test_every_table_entry_is_used(used):
    """Least privilege: an entry no run needs (a resource the program stopped declaring) is a
    grant nobody uses; remote components' children count as used."""
    types = set().union(*(t for t, _ in used.values()))
    invokes = set().union(*(i for _, i in used.values()))
    children = {c for t in types for c in deployer_policy.COMPONENT_CHILDREN.get(t, ())}
    assert set(deployer_policy.RESOURCE_ACTIONS) - types - children == set()
    assert set(deployer_policy.INVOKE_ACTIONS) - invokes - children == set()


def test_a_new_resource_type_or_invoke_is_named():
    missing = deployer_policy.uncovered({"aws:rds/instance:Instance", "eks:index:NodeGroupV2",
                                         "kubernetes:core/v1:Secret"},
                                        {"aws:kms/getKey:getKey"})
    assert missing.resources == ("aws:rds/instance:Instance", "eks:index:NodeGroupV2")
    assert missing.invokes == ("aws:kms/getKey:getKey",)


def test_the_remote_eks_cluster_s_children_are_granted():
    """pulumi-eks creates the aws.eks.Cluster and its role and security groups out of the
    program's sight (nodejs/eks/cluster/cluster.ts createCore)."""
    actions = {a for s in deployer_policy.policy()["Statement"] for a in s["Action"]}
    assert {"eks:CreateCluster", "ec2:CreateSecurityGroup", "eks:CreateAccessEntry",
            "iam:PassRole"} <= actions


def test_committed_document_is_the_generated_one():
    out = subprocess.run([sys.executable, "-m", "stack.deployer_policy"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    assert COMMITTED.read_text() == out, "regenerate: python -m stack.deployer_policy > " \
                                         "docs/deployer-policy.json"


def test_no_statement_grants_a_wildcard_action():
    statements = json.loads(COMMITTED.read_text())["Statement"]
    assert statements
    for statement in statements:
        assert statement["Effect"] == "Allow" and "NotAction" not in statement
        assert all("*" not in action and ":" in action for action in statement["Action"])


def test_what_a_setting_makes_the_provider_call_is_granted():
    """Keyed on the inputs the program declares, not only their types: `forceDestroyBucket`
    sets the bucket's forceDestroy, and its `pulumi destroy` empties the bucket first (every
    version and delete marker: terraform-provider-aws internal/service/s3/delete.go)."""
    granted = {a for s in deployer_policy.policy()["Statement"] for a in s["Action"]}
    committed = {a for s in json.loads(COMMITTED.read_text())["Statement"] for a in s["Action"]}
    for force in ("true", "false"):
        m = run_program(DEV, {"forceDestroyBucket": force})
        needed = set().union(*(deployer_policy.setting_actions(r.type, r.inputs)
                               for r in m.resources))
        assert needed <= granted and needed <= committed
        emptying = {"s3:ListBucketVersions", "s3:DeleteObjectVersion", "s3:DeleteObject"}
        assert (emptying <= needed) == (force == "true")
