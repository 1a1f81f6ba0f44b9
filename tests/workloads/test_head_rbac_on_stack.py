"""Every call a run's head makes (the cold-start timeline, the scale-up watch ending a run that
cannot start, node events classified at a drain notice) against the RBAC the stack itself
creates, on both `runJob` settings: with `runJob: false` the run is one `python -m runs submit`
created, with the Role it adds for its own RayJob. The loopback API server authorizes each
request as Kubernetes RBAC does (tests/training/kube_fake.py)."""

from __future__ import annotations

import pytest

from tests.infra.harness import run_program
from tests.infra.test_program import DEV
from tests.training.kube_fake import FakeKube, cold_start_world
from tests.workloads.test_manifests import S3, stack
from tests.conftest import REPO
from training.head import cold_start, node_events, scaleup
from training.head.kube_api import KubeAPI
from workloads.code_bundle import bundle
from workloads.rayjob import build_rayjob
from workloads.rbac import run_rbac

T0 = 1_796_112_000.0
SUBMITTED = "ray-train-dev-r0123456789"[:26]
RBAC_TYPES = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


def stack_rbac(m) -> list[dict]:
    """The Roles and ClusterRoles the program creates that a binding of it grants to the Ray
    pods' service account (an unbound role grants nothing)."""
    objs = [r.inputs for r in m.resources
            if r.type.startswith("kubernetes:rbac.authorization.k8s.io/v1:")
            and r.type.rsplit(":", 1)[1] in RBAC_TYPES]
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
             for b in objs if "roleRef" in b
             and {"kind": "ServiceAccount", "name": "ray-train", "namespace": "ray"}
             in b["subjects"]}
    return [o for o in objs if "rules" in o and (
        o["kind"], o["metadata"]["name"],
        o["metadata"].get("namespace") if o["kind"] == "Role" else None) in bound]


def submitted_run_rbac() -> list[dict]:
    """What `runs submit` adds: its RayJob as the API returned it (with a uid) -> run_rbac."""
    job = build_rayjob(stack(), bundle(REPO), S3, name=SUBMITTED)
    job["metadata"]["uid"] = "0b0e7a1c-uid"
    return run_rbac(job)


@pytest.mark.parametrize("run_job", ["true", "false"])
def test_every_head_call_is_allowed_by_what_the_stack_creates(run_job, tmp_path):
    m = run_program(DEV, {"runJob": run_job})
    rbac = stack_rbac(m)
    if run_job == "true":
        rayjob = m.exports["rayJob"]
    else:
        assert m.exports.get("rayJob") is None
        rayjob, rbac = SUBMITTED, [*rbac, *submitted_run_rbac()]
    cluster = f"{rayjob}-x7k2p"
    (tmp_path / "token").write_text("test-token")
    with FakeKube(cold_start_world(T0, cluster, rayjob), rbac) as fake:
        api = KubeAPI(fake.url, tmp_path / "token")
        seen = cold_start.observe(api, "ray", cluster, rayjob)
        assert seen["rayjob_created"] == T0 and len(seen["pods"]) == 2
        assert scaleup.read_cause(api, "ray", cluster)[1] == 2
        scaleup.end_run(api, "ray", rayjob, scaleup.Cause("no GPU", "a fix", True))
        assert node_events.classify(("ip-10-0-2-20",), api) == ("drained", None)
        asked = {(verb, resource, ns) for verb, _, resource, ns, _ in fake.requests}
    assert asked == {("list", "pods", "ray"), ("list", "events", "ray"), ("get", "nodes", None),
                     ("get", "rayjobs", "ray"), ("patch", "rayjobs", "ray"),
                     ("get", "configmaps", "kube-system")}


def test_without_the_stacks_roles_a_submitted_runs_head_is_refused(tmp_path):
    """What the stack's roles add: the submitted run's own Role alone lets it read no pod."""
    (tmp_path / "token").write_text("test-token")
    with FakeKube(cold_start_world(T0, "c", SUBMITTED), submitted_run_rbac()) as fake:
        with pytest.raises(Exception, match="HTTP 403"):
            cold_start.observe(KubeAPI(fake.url, tmp_path / "token"), "ray", "c", SUBMITTED)
