"""Node events classified at their notice by the driver's watcher, against a Kubernetes API on
loopback: the reason stays what the Node showed then, after repair deleted the Node; a watcher
that cannot read never stops the run; no API, no thread."""

from __future__ import annotations

import time

import pyarrow.fs as pafs

from tests.training import kube_fake
from training.head import node_events, node_watch
from training.head.kube_api import KubeAPI
from training.run import node_notices
from training.run.run_files import RunFiles
from workloads.rbac import head_rbac

SICK = "ip-10-0-2-20"


def _api(fake: kube_fake.FakeKube, tmp_path) -> KubeAPI:
    env, sa = kube_fake.in_cluster_env(fake, tmp_path, "c", "j")
    return KubeAPI.in_cluster(env, sa)


def _wait(predicate, timeout_s: float = 300.0) -> None:  # a limit only for a hang
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_a_repair_classified_at_its_notice_stays_a_repair_after_its_node_is_gone(tmp_path):
    fs, run = pafs.LocalFileSystem(), str(tmp_path / "run")
    world = {"nodes": [kube_fake.xid_node(SICK, time.time() - 700)]}
    with kube_fake.FakeKube(world, head_rbac("ray", "j", True), tls_dir=tmp_path) as fake:
        api = _api(fake, tmp_path)
        with node_watch.watching(fs, run, api, poll_s=0.05) as watch:
            node_notices.record(RunFiles(fs, run), ("ray-a",), (SICK,), 3)
            _wait(lambda: watch.classified == 1)
            fake.world["nodes"].clear()  # repair replaced it: its Node deleted
        assert not watch.is_alive()
        events = node_events.read_all(fs, run, api)
        # Read only now, as at the summary before: the Node is gone, the reason lost.
        assert node_events.classify((SICK,), api)[0] == "drained"
    [e] = events
    assert (e["reason"], e["detail"]) == ("repair",
                                         "AcceleratedHardwareReady=False (NvidiaXID79Error)")
    assert e["step_saved"] == 3 and e["time"] <= e["classified_at"] <= e["time"] + 10


class ReadOnly:
    """The run's storage refusing writes (an S3 outage, a lost permission)."""

    def __init__(self, fs):
        self.get_file_info, self.open_input_stream = fs.get_file_info, fs.open_input_stream

    def open_output_stream(self, path):
        raise OSError(f"When initiating multiple part upload for key '{path}': AccessDenied")


def test_a_watcher_that_cannot_write_warns_once_and_goes_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(node_events, "SETTLE_S", 0.0)  # no API to retry: it writes at once
    fs, run = pafs.LocalFileSystem(), str(tmp_path / "run")
    node_notices.record(RunFiles(fs, run), ("ray-a",), (SICK,), 3)
    watch = node_watch.NodeWatch(ReadOnly(fs), run, KubeAPI("http://127.0.0.1:1"), poll_s=0.01)
    watch.start()
    _wait(lambda: "AccessDenied" in capsys.readouterr().out or watch.classified)
    time.sleep(0.1)  # more polls, failing the same way
    watch.stopped.set()
    watch.join(5)
    assert not watch.is_alive() and watch.classified == 0
    assert capsys.readouterr().out.count("node events not classified now") == 0  # said once
    # The summary still classifies it, then.
    assert node_events.read_all(fs, run, None)[0]["reason"] == "drained"


def test_no_api_no_thread(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with node_watch.watching(pafs.LocalFileSystem(), str(tmp_path)) as watch:
        assert watch is None
