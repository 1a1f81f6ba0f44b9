"""`python -m runs submit`: the RayJob the stack itself renders (same builder, the stack file's
`training` with `--set` on top), valid under KubeRay 1.7.0's CRD, queued for Kueue; bad settings
refused before anything reaches the API."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
import yaml

from runs.cli import main
from runs.render import stack_raw
from stack.parse import parse
from tests.conftest import KUBERAY_CRDS, REPO, need
from tests.runs.conftest import CLUSTER, IMAGE, S3
from tests.workloads.crd_schema import load_schema, rayjob_rules, validate
from workloads.code_bundle import bundle
from workloads.kueue import LOCAL_QUEUE, QUEUE_LABEL
from workloads.rayjob import build_rayjob


def dry_run(outputs, capsys, *sets: str) -> dict:
    args = ["submit", "--outputs", str(outputs), "--dry-run"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return next(yaml.safe_load_all(capsys.readouterr().out))


def stacks_own(overrides: dict) -> dict:
    """The RayJob `pulumi up` declares for the dev stack with these `training` settings."""
    raw, region = stack_raw("dev", overrides)
    cfg = dataclasses.replace(parse(raw, region, default_name=CLUSTER), image=IMAGE)
    return build_rayjob(cfg, bundle(REPO), S3)


def flags(entrypoint: str) -> dict[str, str]:
    """`--flag value` (or a lone `--flag`) of `python -m training ...`."""
    words, out = shlex.split(entrypoint)[3:], {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else ""
            out[w] = "" if nxt.startswith("--") else nxt
    return out


def renamed(job: dict, old: str, new: str) -> dict:
    return json.loads(json.dumps(job).replace(old, new))


def test_dry_run_is_the_stacks_rayjob_but_for_its_name_and_the_settings(outputs, capsys, api):
    ours = dry_run(outputs, capsys, "steps=50", "lr=1e-5")
    name = ours["metadata"]["name"]
    assert name.startswith(f"{CLUSTER}-r")
    theirs = stacks_own({"steps": 50, "lr": 1e-5})
    assert theirs["metadata"]["name"] != name  # the stack can never adopt a submitted run
    same = renamed(theirs, theirs["metadata"]["name"], name)
    same["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "eks-ray-train-runs"
    assert ours == same
    # Against the stack's own run as committed: only the two settings in the entrypoint.
    committed = stacks_own({})
    committed = renamed(committed, committed["metadata"]["name"], name)
    args, base = flags(ours["spec"]["entrypoint"]), flags(committed["spec"]["entrypoint"])
    assert {k: v for k, v in args.items() if base.get(k) != v} == {"--steps": "50",
                                                                    "--lr": "1e-05"}
    assert args.keys() == base.keys()
    assert {k: v for k, v in ours["spec"].items() if k != "entrypoint"} == \
        {k: v for k, v in committed["spec"].items() if k != "entrypoint"}
    assert api.requests == []  # nothing created


def test_dry_run_carries_the_queue_label_is_suspended_and_validates_strictly(outputs, capsys):
    job = dry_run(outputs, capsys, "steps=50")
    assert job["metadata"]["labels"][QUEUE_LABEL] == LOCAL_QUEUE
    assert job["spec"]["suspend"] is True and job["spec"]["shutdownAfterJobFinishes"] is True
    schema = load_schema(need(KUBERAY_CRDS / "ray.io_rayjobs.yaml"))
    assert validate(job, schema) == [] and rayjob_rules(job) == []


@pytest.mark.parametrize("pair, says", [
    ("lrr=1e-5", "--set lrr: unknown training setting; did you mean lr?"),
    ("setps=50", "did you mean steps?"),
    ("numWorkers=4", "--set numWorkers: set by the stack"),
    ("steps", "--set steps: expected key=value"),
    ("steps=-5", "training.steps"),
])
def test_a_bad_setting_is_refused_in_one_line_before_anything_is_created(
        outputs, capsys, api, pair, says):
    assert main(["submit", "--outputs", str(outputs), "--set", pair]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid stack configuration:\n  - ") and says in err
    assert err.count("\n") == 2  # the heading and the one problem
    assert api.requests == []


def test_every_bad_setting_is_listed_at_once_one_a_line(outputs, capsys, api):
    """As the stack and the job list theirs (training.errors.ConfigError): no `:;` joins."""
    assert main(["submit", "--outputs", str(outputs), "--set", "lr=abc", "--set", "steps=-3",
                 "--set", "setps=5"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "error: invalid stack configuration:"
    assert [line.split(":")[0].split(" (")[0] for line in lines[1:]] == [
        "  - --set setps", "  - training.lr", "  - training.steps"]
    assert api.requests == []


def test_submit_creates_the_rendered_rayjob(outputs, capsys, api):
    job = dry_run(outputs, capsys, "steps=50")
    assert main(["submit", "--outputs", str(outputs), "--set", "steps=50"]) == 0
    assert api.names() == [job["metadata"]["name"]]
    stored = api.world["rayjobs"][0]
    assert stored["spec"] == job["spec"]
    assert stored["metadata"]["labels"] == job["metadata"]["labels"]
    # The same settings again: the run exists (cancel it to run it again; it resumes).
    assert main(["submit", "--outputs", str(outputs), "--set", "steps=50"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_outputs_of_a_stack_deployed_before_runs_context_are_refused(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"kubeconfig": "{}", "checkpointStorage": S3,
                                "rayNamespace": "ray"}))
    assert main(["submit", "--outputs", str(path), "--dry-run"]) == 2
    assert "no output runsContext; run `pulumi up`" in capsys.readouterr().err


def test_a_submitted_runs_head_may_read_its_own_rayjob_through_a_role_the_run_owns(
        outputs, capsys, api):
    """The stack's Role names only the stack's own RayJob: without a Role of the run's own its
    head's cold-start timeline and scale-up watch are refused (403) on their first read."""
    from tests.training.kube_fake import allowed
    from workloads.rbac import head_rbac

    assert main(["submit", "--outputs", str(outputs), "--set", "steps=50"]) == 0
    job = api.world["rayjobs"][0]
    name, ns, uid = job["metadata"]["name"], job["metadata"]["namespace"], job["metadata"]["uid"]
    stacks = head_rbac(ns, "ray-train-dev-f44c3b4189", True)
    assert not allowed(stacks, "get", "ray.io", "rayjobs", ns, name)
    granted = [*api.world["roles"], *api.world["rolebindings"]]
    assert {o["kind"] for o in granted} == {"Role", "RoleBinding"}
    for obj in granted:  # deleted with the run by the garbage collector
        assert [(r["kind"], r["name"], r["uid"]) for r in obj["metadata"]["ownerReferences"]] \
            == [("RayJob", name, uid)]
    assert allowed([*stacks, *granted], "get", "ray.io", "rayjobs", ns, name)
    assert not allowed([*stacks, *granted], "get", "ray.io", "rayjobs", ns, "another-run")
    ends = any("--end-on-scaleup-failure" in c.get("command", []) for c in job["spec"][
        "rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"])
    assert allowed([*stacks, *granted], "patch", "ray.io", "rayjobs", ns, name) == ends
