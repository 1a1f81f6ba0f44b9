"""No GPU billed for a run that cannot start: the head's watch reads why the GPU workers are not
coming (cluster-autoscaler 1.35's pod events and status ConfigMap, written as it writes them:
tests/training/kube_fake.py) and, when the cause is definite, fails the RayJob."""

from __future__ import annotations

import pytest

from tests.training.kube_fake import (GROUP, FakeKube, autoscaler_status, event, pod, rayjob,
                                      in_cluster_env)
from training.head import scaleup
from training.head.kube_api import KubeAPI
from workloads.rbac import head_rbac

T0 = 1_796_112_000.0
CLUSTER, JOB = "ray-train-dev-f44c3b4189-x7k2p", "ray-train-dev-f44c3b4189"
ICE = {"name": GROUP, "scale_up": "Backoff", "code": "placeholder-cannot-be-fulfilled",
       "message": "AWS cannot provision any more instances for this node group"}


def world(events_for, groups: list[dict], scheduled: int = 0) -> dict:
    """Two GPU worker pods (the first `scheduled` of them on a node), the events
    `events_for(pod)` on each pending one, and the autoscaler status with `groups`."""
    pods = [pod(f"{CLUSTER}-head-abcde", CLUSTER, T0 + 2, "ip-10-0-1-10", T0 + 2, T0 + 30,
                "head")]
    events = []
    for i, suffix in enumerate(("aaaaa", "bbbbb")):
        if i < scheduled:
            pods.append(pod(f"{CLUSTER}-gpu-worker-{suffix}", CLUSTER, T0 + 3, f"n{i}", T0 + 150,
                            T0 + 400))
        else:
            p = pod(f"{CLUSTER}-gpu-worker-{suffix}", CLUSTER, T0 + 3)
            pods.append(p)
            events += events_for(p)
    return {"rayjobs": [rayjob(JOB, T0)], "pods": pods, "events": events, "nodes": [],
            "configmaps": [autoscaler_status(groups)]}


def triggered(p):
    return [event(p, "TriggeredScaleUp", f"pod triggered scale-up: [{{{GROUP} 0->2 (max: 2)}}]",
                  T0 + 14, component="cluster-autoscaler")]


def not_triggered(*reasons: str):
    def events(p):
        return [event(p, "NotTriggerScaleUp", "pod didn't trigger scale-up: " + ", ".join(reasons),
                      T0 + 20, T0 + 300, "cluster-autoscaler", count=28)]
    return events


def after_ice(p):
    """Scale-up triggered, EC2 launched nothing, the group backs off; later loops skip it."""
    return triggered(p) + not_triggered("1 in backoff after failed scale-up",
                                        "1 node(s) didn't match Pod's node affinity/selector")(p)


def diagnose(w: dict) -> scaleup.Cause | None:
    return scaleup.diagnose(w["pods"], w["events"], w["configmaps"][0])


def test_ec2_launching_nothing_is_definite_and_names_how_to_see_ec2s_reason():
    cause = diagnose(world(after_ice, [ICE]))
    assert cause.definite
    assert "AWS cannot provision any more instances" in cause.summary
    assert f"describe-scaling-activities --auto-scaling-group-name {GROUP}" in cause.fix
    assert "VcpuLimitExceeded" in cause.fix and "InsufficientInstanceCapacity" in cause.fix


def test_one_node_launched_and_the_other_failed_is_definite_too():
    cause = diagnose(world(after_ice, [ICE], scheduled=1))
    assert cause is not None and cause.definite


def test_nodes_that_never_register_are_definite_with_the_bootstrap_fix():
    timeout = {"name": GROUP, "scale_up": "Backoff", "code": "timeout",
               "message": f"Scale-up timed out for node group {GROUP} after 15m0.4s"}
    cause = diagnose(world(after_ice, [timeout]))
    assert cause.definite and "never joined" in cause.summary and "console-output" in cause.fix


def test_a_group_at_its_maximum_may_clear_up_and_is_not_definite():
    cause = diagnose(world(not_triggered("1 max node group size reached",
                                         "1 node(s) didn't match Pod's node affinity/selector"),
                           [{"name": GROUP, "scale_up": "NoActivity"}]))
    assert not cause.definite and "max node group size reached" in cause.summary


def test_no_node_group_template_that_fits_is_definite():
    cause = diagnose(world(not_triggered("1 Insufficient vpc.amazonaws.com/efa",
                                         "1 node(s) didn't match Pod's node affinity/selector"),
                           [{"name": GROUP, "scale_up": "NoActivity"}]))
    assert cause.definite and "Insufficient vpc.amazonaws.com/efa" in cause.summary
    assert "node-template" in cause.fix


def test_a_scale_up_under_way_is_no_failure():
    cause = diagnose(world(triggered, [{"name": GROUP, "scale_up": "InProgress"}]))
    assert not cause.definite and "in progress" in cause.summary


def test_a_backoff_of_another_group_is_not_ours():
    other = {**ICE, "name": "eks-system-2026120108-1a2b"}
    cause = diagnose(world(triggered, [other, {"name": GROUP, "scale_up": "InProgress"}]))
    assert not cause.definite


def test_every_worker_on_a_node_means_no_cause():
    assert diagnose(world(after_ice, [ICE], scheduled=2)) is None


def api_for(fake: FakeKube, tmp_path) -> KubeAPI:
    (tmp_path / "token").write_text("test-token")
    return KubeAPI(fake.url, tmp_path / "token")


def test_a_definite_cause_fails_the_rayjob_under_the_deployed_role(tmp_path):
    said, polls = [], []
    with FakeKube(world(after_ice, [ICE]), head_rbac("ray", JOB, True)) as fake:
        result = scaleup.watch(api_for(fake, tmp_path), "ray", CLUSTER, JOB, end=True,
                               say=said.append, sleep=polls.append)
        job = fake.object("rayjobs", JOB)
    assert result == "ended" and len(polls) == 1  # seen on two polls in a row, then ended
    # KubeRay fails a RayJob past its activeDeadlineSeconds and then deletes its cluster.
    assert job["spec"]["activeDeadlineSeconds"] == 1
    assert job["spec"]["ttlSecondsAfterFinished"] == 60
    assert "AWS cannot provision" in job["metadata"]["annotations"][scaleup.CAUSE_ANNOTATION]
    assert said[0].startswith("scale-up: EC2 launched no instance") and "ended RayJob" in said[-1]
    assert len(said) == 2  # the cause once, not once per poll


def test_with_ending_off_the_watch_only_reports(tmp_path):
    said = []

    def sleep(_):
        if len(said) and sleep.calls == 3:
            raise StopIteration
        sleep.calls += 1
    sleep.calls = 0
    with FakeKube(world(after_ice, [ICE]), head_rbac("ray", JOB, False)) as fake:
        with pytest.raises(StopIteration):
            scaleup.watch(api_for(fake, tmp_path), "ray", CLUSTER, JOB, end=False,
                          say=said.append, sleep=sleep)
        job = fake.object("rayjobs", JOB)
        verbs = {v for v, *_ in fake.requests}
    assert job["spec"]["activeDeadlineSeconds"] == 14400 and "patch" not in verbs
    assert len(said) == 1 and "the run cannot start" in said[0]


def test_a_role_without_patch_is_reported_and_the_deadline_still_applies(tmp_path):
    said = []
    with FakeKube(world(after_ice, [ICE]), head_rbac("ray", JOB, False)) as fake:
        result = scaleup.watch(api_for(fake, tmp_path), "ray", CLUSTER, JOB, end=True,
                               say=said.append, sleep=lambda _: None)
    assert result == "not ended" and "HTTP 403" in said[-1] and "preRunningDeadline" in said[-1]


def test_the_watch_ends_quietly_once_every_worker_has_a_node(tmp_path):
    said = []
    w = world(after_ice, [ICE], scheduled=2)
    with FakeKube(w, head_rbac("ray", JOB, True)) as fake:
        result = scaleup.watch(api_for(fake, tmp_path), "ray", CLUSTER, JOB, end=True,
                               say=said.append, sleep=lambda _: None)
    assert result == "joined" and said == ["scale-up: every worker pod has a node"]


def test_the_watch_reads_only_what_its_role_allows(tmp_path):
    """Run as the head runs it (in-cluster environment, TLS) until it ends the run."""
    with FakeKube(world(after_ice, [ICE]), head_rbac("ray", JOB, True),
                  tls_dir=tmp_path) as fake:
        env, sa = in_cluster_env(fake, tmp_path, CLUSTER, JOB)
        api = KubeAPI.in_cluster(env, sa)
        assert scaleup.watch(api, "ray", CLUSTER, JOB, True, sleep=lambda _: None) == "ended"
        asked = {(v, r, ns) for v, _, r, ns, _ in fake.requests}
    assert asked == {("list", "pods", "ray"), ("list", "events", "ray"),
                     ("get", "configmaps", "kube-system"), ("patch", "rayjobs", "ray")}


def test_no_api_here_means_no_watch(capsys):
    assert scaleup.main([], env={}) == 0
    assert "not watching" in capsys.readouterr().err


def test_the_jobs_own_wait_for_workers_says_why_they_are_missing(tmp_path, monkeypatch, capsys):
    from tests.training.driver.test_job_start import EIGHT_GPUS, arriving
    from training.driver import cli
    from training.head import kube_api

    with FakeKube(world(after_ice, [ICE]), head_rbac("ray", JOB, True),
                  tls_dir=tmp_path) as fake:
        env, sa = in_cluster_env(fake, tmp_path, CLUSTER, JOB)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(kube_api, "SA_DIR", sa)
        cli._check_capacity(EIGHT_GPUS, True, arriving(0, 8), wait_s=60, poll_s=0.01)
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("waiting for workers: 0 of 8 GPUs")
    assert "scale-up: EC2 launched no instance" in line


@pytest.mark.parametrize("end", [True, False])
def test_the_head_containers_command_ends_the_run_only_when_the_stack_says_so(
        tmp_path, monkeypatch, end):
    """The command workloads/scaleup_watch.py renders, run as the container runs it (minus
    staying up afterwards, and without the 15 s between polls)."""
    import dataclasses

    from tests.workloads.test_manifests import stack
    from training.head import kube_api
    from workloads.scaleup_watch import watch_container

    cfg = dataclasses.replace(stack(), end_on_scale_up_failure=end)
    command = watch_container(cfg, JOB)["command"]
    assert command[:3] == ["python", "-m", "training.head.scaleup"]
    argv = [a for a in command[3:] if a != "--stay"] + ["--poll-s", "0"]
    with FakeKube(world(after_ice, [ICE]), head_rbac("ray", JOB, end),
                  tls_dir=tmp_path) as fake:
        env, sa = in_cluster_env(fake, tmp_path, CLUSTER, JOB)
        monkeypatch.setattr(kube_api, "SA_DIR", sa)
        if end:
            assert scaleup.main(argv, env) == 0
        else:  # it would report forever: stop it at its third poll
            polls = iter(range(3))
            monkeypatch.setattr(scaleup.time, "sleep", lambda _: next(polls))
            assert scaleup.main(argv, env) == 0  # the StopIteration is caught and reported
        deadline = fake.object("rayjobs", JOB)["spec"]["activeDeadlineSeconds"]
    assert deadline == (1 if end else 14400)


def test_a_worker_pending_again_mid_run_without_spot_capacity_ends_the_run(tmp_path):
    """After every worker had a node, one loses it (a spot reclaim) and its replacement pod finds
    no spot capacity: the watch, still going, ends the run with the spot fixes."""
    said = []
    w = world(after_ice, [ICE], scheduled=2)

    def sleep(_):
        if said == [scaleup.JOINED]:  # the second worker's node is reclaimed
            w["pods"][2] = pod(f"{CLUSTER}-gpu-worker-ccccc", CLUSTER, T0 + 900)
            w["events"] += after_ice(w["pods"][2])
            fake.world.update(w)
    market = scaleup.Market("spot", "All G and VT Spot Instance Requests, L-3819A6DF")
    with FakeKube(w, head_rbac("ray", JOB, True)) as fake:
        result = scaleup.watch(api_for(fake, tmp_path), "ray", CLUSTER, JOB, end=True,
                               say=said.append, sleep=sleep, market=market, after_join=True)
        job = fake.object("rayjobs", JOB)
    assert result == "ended" and said[0] == scaleup.JOINED
    assert "EC2 launched no instance" in said[1] and "gpuCapacityType on-demand" in said[1]
    assert "'All G and VT Spot Instance Requests, L-3819A6DF'" in said[1]
    assert job["spec"]["activeDeadlineSeconds"] == 1
