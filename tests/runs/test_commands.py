"""`list`, `logs`, `show` and `cancel` against a fake API holding RayJobs in the states KubeRay
1.7.0 and Kueue leave them in, and the one-line errors: an unknown run, no credentials, no
cluster."""

from __future__ import annotations

import json

import pytest

from runs.cli import main
from tests.runs.conftest import outputs_file
from tests.runs.fake_api import T0, FakeAPI, submitter_pod
from tests.training.kube_fake import ts

DIGEST = "0d65adbd1ec24d707b8f422a369a91f0d24db5cd6806ce24875d37ae8e58cd03"
SUMMARY = {"steps": 50, "final_loss": 1.234, "tokens_per_s": 48000}


def rayjob(name: str, created: float, suspend: bool, status: dict | None = None,
           submitted: bool = True) -> dict:
    labels = {"kueue.x-k8s.io/queue-name": "runs",
              **({"app.kubernetes.io/managed-by": "eks-ray-train-runs"} if submitted else {})}
    worker = {"replicas": 2, "groupName": "gpu", "template": {"spec": {"containers": []}}}
    head = {"template": {"spec": {"containers": [{"name": "ray-head", "env": [
        {"name": "GPU_NODE_USD_PER_HOUR", "value": "4.6016"}]}]}}}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": "ray", "labels": labels,
                         "creationTimestamp": ts(created),
                         "annotations": {"eks-ray-train/code-digest": DIGEST}},
            "spec": {"suspend": suspend, "shutdownAfterJobFinishes": True,
                     "rayClusterSpec": {"headGroupSpec": head, "workerGroupSpecs": [worker]}},
            "status": status or {}}


RUNNING = rayjob("ray-train-dev-r000000001", T0, False,
                 {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                  "startTime": ts(T0 + 60)})
DONE = rayjob("ray-train-dev-r000000000", T0 - 7200, False,
              {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED",
               "startTime": ts(T0 - 7200), "endTime": ts(T0 - 3600)}, submitted=False)
# Kueue holds these suspended (KubeRay: Suspended); the older is next.
QUEUED = [rayjob("ray-train-dev-r000000003", T0 + 300, True, {"jobDeploymentStatus": "Suspended"}),
          rayjob("ray-train-dev-r000000002", T0 + 200, True, {"jobDeploymentStatus": "Suspended"})]
LOG = ("(RayTrainWorker pid=1) step 11/50  loss 2.3456  lr 1.00e-05\n"
       "(RayTrainWorker pid=1) step 12/50  loss 2.2222  lr 1.00e-05\n")


@pytest.fixture()
def world():
    pods = [submitter_pod(RUNNING["metadata"]["name"], T0 + 400),
            submitter_pod(DONE["metadata"]["name"], T0 - 7000)]
    logs = {pods[0]["metadata"]["name"]: LOG,
            pods[1]["metadata"]["name"]: LOG + json.dumps(SUMMARY) + "\n"}
    with FakeAPI([DONE, RUNNING, *QUEUED], pods, logs) as fake:
        yield fake


def run(world, tmp_path, *args, token=None) -> int:
    path = outputs_file(tmp_path, world.kubeconfig(*([token] if token else [])))
    return main([*args[:1], "--outputs", str(path), *args[1:]])


def test_list_shows_each_run_with_its_state_queue_position_step_loss_and_cost(
        world, tmp_path, capsys):
    assert run(world, tmp_path, "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "STEP", "LOSS", "STARTED", "GPU", "USD"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert "queued (1)" in rows["ray-train-dev-r000000002"]
    assert "queued (2)" in rows["ray-train-dev-r000000003"]
    done = rows["ray-train-dev-r000000000"].split()
    # Two GPU nodes for the hour between admission and the end.
    assert done[1:4] == ["succeeded", "12/50", "2.2222"] and done[-1] == f"{2 * 4.6016:.2f}"
    assert rows["ray-train-dev-r000000001"].split()[1:4] == ["running", "12/50", "2.2222"]
    # Queued runs have no Ray cluster and no submitter: no log is asked for.
    assert not any("r000000002" in path and "pods" in path for _, path in world.requests)


def test_logs_and_show_read_the_submitters_output(world, tmp_path, capsys):
    assert run(world, tmp_path, "logs", "ray-train-dev-r000000001") == 0
    assert capsys.readouterr().out == LOG
    assert run(world, tmp_path, "logs", "ray-train-dev-r000000001", "-f") == 0
    assert capsys.readouterr().out == LOG  # followed until the container's log ends
    assert run(world, tmp_path, "show", "ray-train-dev-r000000000") == 0
    assert json.loads(capsys.readouterr().out) == {**SUMMARY, "code_digest": DIGEST}
    assert run(world, tmp_path, "show", "ray-train-dev-r000000001") == 2
    assert f"no summary yet (running; code {DIGEST})" in capsys.readouterr().err
    assert run(world, tmp_path, "logs", "ray-train-dev-r000000002") == 2
    assert "no job output yet" in capsys.readouterr().err


def test_show_keeps_the_digest_the_summary_records(tmp_path, capsys):
    """A job prints a finished run's summary again, whose code_digest names the code that
    trained it, not the code this RayJob carries."""
    trained = {**SUMMARY, "code_digest": "1" * 64}
    pod = submitter_pod(DONE["metadata"]["name"], T0 - 7000)
    with FakeAPI([DONE], [pod], {pod["metadata"]["name"]: json.dumps(trained) + "\n"}) as api:
        assert run(api, tmp_path, "show", "ray-train-dev-r000000000") == 0
    assert json.loads(capsys.readouterr().out) == trained


def test_cancel_deletes_a_run_and_all_deletes_only_the_submitted_ones(world, tmp_path, capsys):
    assert run(world, tmp_path, "cancel", "ray-train-dev-r000000002") == 0
    assert "checkpoints stay" in capsys.readouterr().out
    assert "ray-train-dev-r000000002" not in world.names()
    assert run(world, tmp_path, "cancel", "--all") == 0
    assert world.names() == ["ray-train-dev-r000000000"]  # the stack's own, not submitted


@pytest.mark.parametrize("command", [("logs", "nope"), ("show", "nope"), ("cancel", "nope")])
def test_an_unknown_run_is_one_line(world, tmp_path, capsys, command):
    assert run(world, tmp_path, *command) == 2
    assert capsys.readouterr().err == "error: run nope: not found\n"


def test_refused_credentials_are_one_line(world, tmp_path, capsys):
    assert run(world, tmp_path, "list", token="expired") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: list runs: the API refused the credentials (HTTP 401)")
    assert err.count("\n") == 1


def test_no_cluster_is_one_line(tmp_path, capsys):
    with FakeAPI() as gone:
        kubeconfig = gone.kubeconfig()
    path = outputs_file(tmp_path, kubeconfig)  # its port is closed now
    assert main(["list", "--outputs", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the cluster's API" in err and err.count("\n") == 1
