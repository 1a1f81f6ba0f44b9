"""Where the first minutes go: the head reads what Kubernetes recorded of the run's start through
its own client, from a loopback API server holding objects written from the API reference
(tests/training/kube_fake.py), under the Roles the stack deploys."""

from __future__ import annotations

import pytest

from tests.training import kube_fake
from tests.training.kube_fake import FakeKube, cold_start_world, in_cluster_env
from training.head import cold_start
from training.head.kube_api import KubeAPI, KubeAPIError
from workloads.rbac import head_rbac

T0 = 1_796_112_000.0  # 2026-12-01T08:00:00Z, the RayJob's creation
CLUSTER, JOB = "ray-train-dev-f44c3b4189-x7k2p", "ray-train-dev-f44c3b4189"
PRICE = 4.6016
# What the job's own clock says (seconds after T0): the driver starts once KubeRay submits,
# the Ray workers join, then the loop's milestones on rank 0.
JOB_MARKS = {"job_started": 430, "workers_joined": 433, "train_started": 440, "nccl_ready": 446,
             "model_ready": 470, "first_step": 480}


def marks() -> dict:
    return {k: T0 + v for k, v in JOB_MARKS.items()}


@pytest.fixture()
def kube(tmp_path):
    with FakeKube(cold_start_world(T0), head_rbac("ray", JOB, True),
                  tls_dir=tmp_path) as fake:
        yield fake


def test_the_head_reads_its_start_over_https_with_its_token_and_ca_under_its_role(kube, tmp_path):
    env, sa = in_cluster_env(kube, tmp_path, CLUSTER, JOB)
    observed = cold_start.observe_here(env, sa)
    assert observed["rayjob_created"] == T0
    pods = {p["name"].rsplit("-", 1)[1]: p for p in observed["pods"]}
    assert set(pods) == {"aaaaa", "bbbbb"}  # the workers, not the head
    assert pods["aaaaa"]["node_created"] == T0 + 95 and pods["bbbbb"]["node_ready"] == T0 + 140
    assert pods["aaaaa"]["pull_s"] == pytest.approx(232.7)  # kubelet's "in 3m52.7s"
    assert pods["bbbbb"]["image_bytes"] == 17283459072
    assert pods["aaaaa"]["scale_up_triggered"] == T0 + 14
    # Every read was authorized by the deployed Roles, and the node reads were by name.
    assert {(verb, resource) for verb, _, resource, _, _ in kube.requests} == {
        ("list", "pods"), ("list", "events"), ("get", "nodes"), ("get", "rayjobs")}


def test_phases_from_the_rayjob_to_the_first_step_with_seconds_and_gpu_dollars(kube, tmp_path):
    env, sa = in_cluster_env(kube, tmp_path, CLUSTER, JOB)
    t = cold_start.timeline(cold_start.observe_here(env, sa), marks(), PRICE)
    names = [p["phase"] for p in t["phases"]]
    assert names == [name for _, name in cold_start.PHASES]  # every phase, in run order
    by = {p["phase"]: p for p in t["phases"]}
    # The run waits for its last worker: node 2 registered at +101 s, Ready at +140 s; the last
    # pull ended at +398 s, after the last pod was scheduled at +158 s.
    assert by["GPU nodes becoming Ready"]["seconds"] == 39
    assert by["image pull"]["seconds"] == 398 - 158
    assert by["first optimizer step"]["seconds"] == 10
    assert t["total_s"] == 480 and t["image_pull_s"] == [232.7, 240.1]
    # No GPU node existed while the pods waited for the scale-up: those phases cost nothing.
    assert by["worker pods pending until cluster-autoscaler scales up"]["usd"] == 0
    # Two nodes from +95 s and +101 s until the first step at +480 s.
    assert t["gpu_node_usd"] == pytest.approx((385 + 379) * PRICE / 3600, abs=1e-3)


def test_the_log_has_a_line_per_phase_and_the_total(kube, tmp_path, capsys):
    env, sa = in_cluster_env(kube, tmp_path, CLUSTER, JOB)
    t = cold_start.summarize(cold_start.observe_here(env, sa), marks(), env)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cold start (from the RayJob's creation)")
    assert len(out) == len(t["phases"]) + 2
    assert "image pull" in out[6]
    assert "480.0 s to first optimizer step, GPU nodes 0.98 USD, image pulls 233/240 s" in out[-1]


def test_without_a_price_the_phases_have_no_dollars(kube, tmp_path):
    env, sa = in_cluster_env(kube, tmp_path, CLUSTER, JOB, price=None)
    t = cold_start.summarize(cold_start.observe_here(env, sa), marks(), env)
    assert t["gpu_node_usd"] is None and all(p["usd"] is None for p in t["phases"])


def test_a_role_without_nodes_is_refused_and_the_run_goes_on_without_a_timeline(
        tmp_path, capsys):
    no_nodes = [m for m in head_rbac("ray", JOB, True) if "ClusterRole" not in m["kind"]]
    with FakeKube(cold_start_world(T0), no_nodes) as fake:
        api = KubeAPI(fake.url, tmp_path / "token")
        (tmp_path / "token").write_text("test-token")
        with pytest.raises(KubeAPIError, match='HTTP 403 .*cannot get resource "nodes"'):
            cold_start.observe(api, "ray", CLUSTER, JOB)


def test_an_unreachable_api_warns_and_gives_no_timeline(tmp_path, capsys):
    with FakeKube({}, None) as fake:
        env, sa = in_cluster_env(fake, tmp_path, CLUSTER, JOB)
    # The server is gone: the head's API calls fail.
    assert cold_start.observe_here(env, sa) is None
    assert "WARNING: no cold-start timeline: cannot read the Kubernetes API" in \
        capsys.readouterr().err
    assert cold_start.summarize(None, marks(), env) is None


def test_a_local_run_has_no_api_and_says_nothing(tmp_path, capsys):
    assert cold_start.observe_here({}, tmp_path) is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("text, seconds", [("2m13.5s", 133.5), ("313ms", 0.313),
                                           ("1h2m3s", 3723.0), ("4.2s", 4.2)])
def test_go_durations_as_kubelet_prints_them(text, seconds):
    assert cold_start.go_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2 minutes", "5x"])
def test_a_malformed_duration_is_refused(text):
    with pytest.raises(ValueError):
        cold_start.go_seconds(text)


def test_a_run_that_waited_in_the_queue_counts_its_cold_start_from_admission(tmp_path):
    """Kueue held the RayJob suspended for 15 minutes; KubeRay 1.7.0 set status.startTime when
    Kueue unsuspended it (rayjob_controller.go, Suspended -> New -> initRayJobStatusIfNeed). The
    wait is queue time, not cold start: no node or pod existed for it."""
    world = cold_start_world(T0)
    job = world["rayjobs"][0]
    job["metadata"]["creationTimestamp"] = kube_fake.ts(T0 - 900)
    job["status"]["startTime"] = kube_fake.ts(T0)
    with FakeKube(world, head_rbac("ray", JOB, True), tls_dir=tmp_path) as fake:
        env, sa = in_cluster_env(fake, tmp_path, CLUSTER, JOB)
        t = cold_start.timeline(cold_start.observe_here(env, sa), marks(), PRICE)
    assert t["queue_s"] == 900
    assert t["total_s"] == 480  # as for a run admitted at once
    assert "after 900.0 s in the queue" in cold_start.report_lines(t)[0]
