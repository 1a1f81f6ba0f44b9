"""A repair's drain is a repair however the watch's polls fall: the Node deleted by the repair's
Replace right after the notice, or a read of it that fails at the notice (a busy API). The watch
keeps what each worker's Node showed from the run's start, and leaves a notice it can neither
read nor recall for its next poll. Polls are called one by one here: no timing involved."""

from __future__ import annotations

import time

import pyarrow.fs as pafs

from tests.training import kube_fake
from training.head import node_events, node_watch
from training.head.kube_api import KubeAPI
from training.run import node_notices
from training.run.run_files import RunFiles
from workloads.rbac import head_rbac

SICK, CLUSTER = "ip-10-0-2-20", "ray-train-dev-f44c3b4189-x7k2p"
REPAIR = ("repair", "AcceleratedHardwareReady=False (NvidiaXID79Error)")


def _watch(fake, tmp_path, run, cluster=("ray", CLUSTER)) -> node_watch.NodeWatch:
    (tmp_path / "token").write_text(kube_fake.TOKEN)
    return node_watch.NodeWatch(pafs.LocalFileSystem(), run,
                                KubeAPI(fake.url, tmp_path / "token"), cluster=cluster)


def _events(run) -> list[dict]:
    return node_events.read_all(pafs.LocalFileSystem(), run, None)


def test_a_node_deleted_right_after_the_notice_is_still_a_repair(tmp_path):
    run, t0 = str(tmp_path / "run"), time.time()
    worker = kube_fake.pod(f"{CLUSTER}-gpu-worker-aaaaa", CLUSTER, t0, SICK, t0, t0)
    world = {"pods": [worker], "nodes": [kube_fake.xid_node(SICK, t0 - 700)]}
    with kube_fake.FakeKube(world, head_rbac("ray", "j", True)) as fake:
        watch = _watch(fake, tmp_path, run)
        watch.sweep()  # a poll during the run: the agent's condition is on the Node
        node_notices.record(RunFiles(pafs.LocalFileSystem(), run), ("ray-a",), (SICK,), 3)
        fake.world["nodes"].clear()  # Replace: the Node is gone before the next poll
        watch.sweep()
    assert watch.classified == 1
    [e] = _events(run)
    assert (e["reason"], e["detail"]) == REPAIR


def test_a_node_that_cannot_be_read_at_the_notice_is_tried_again(tmp_path):
    """No worker pods to watch (a head without RAY_CLUSTER_NAME): the first read at the notice
    fails, nothing is written; the next poll reads the Node and writes `repair`."""
    run = str(tmp_path / "run")
    with kube_fake.FakeKube({"nodes": []}, head_rbac("ray", "j", True)) as fake:
        watch = _watch(fake, tmp_path, run, cluster=None)
        node_notices.record(RunFiles(pafs.LocalFileSystem(), run), ("ray-a",), (SICK,), 3)
        watch.sweep()
        assert watch.classified == 0 and _events(run)[0].get("classified_at")  # read-only
        assert not list((tmp_path / "run" / node_notices.EVENTS_DIR).glob("*.reason.json"))
        fake.world["nodes"].append(kube_fake.xid_node(SICK, time.time() - 700))
        watch.sweep()
    assert watch.classified == 1
    [e] = _events(run)
    assert (e["reason"], e["detail"]) == REPAIR


def test_a_node_neither_read_nor_recalled_is_drained_once_settled(tmp_path):
    run = str(tmp_path / "run")
    with kube_fake.FakeKube({"nodes": []}, head_rbac("ray", "j", True)) as fake:
        watch = _watch(fake, tmp_path, run, cluster=None)
        node_notices.record(RunFiles(pafs.LocalFileSystem(), run), ("ray-a",), (SICK,), 3)
        written = node_events.classify_new(watch.fs, run, watch.api, settle_s=0.0)
    assert written == 1
    [e] = _events(run)
    assert e["reason"] == "drained"
