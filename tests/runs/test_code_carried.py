"""A submitted run carries the checkout it was submitted from: its own ConfigMap, named for the
run and the bundle's digest, created after the RayJob with an owner reference to its uid (the
garbage collector deletes it with the run), the digest on the RayJob and in `show`. A bundle the
API server would refuse is refused before anything is created. And the CLI's failures, one line
each: no credentials from `aws eks get-token`, an outputs file short of a key, a dry run from the
stack file alone."""

from __future__ import annotations

import json
import logging
import shutil
import stat

import pytest
import yaml

from runs import render
from runs.cli import main
from stack.kube import CODE_DIGEST_ANNOTATION
from tests.conftest import KUBERAY_CRDS, REPO, SHARED, need
from tests.runs.conftest import outputs_file
from tests.workloads.crd_schema import load_schema, validate
from training.pod_contract import CODE_DIGEST_ENV
from workloads.code_bundle import CONFIGMAP_LIMIT_BYTES, CodeBundleError, bundle


@pytest.fixture()
def checkout(tmp_path, monkeypatch):
    """A copy of what `runs submit` reads of its checkout: the stack files and training/."""
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "training", root / "training",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("Pulumi.yaml", "Pulumi.dev.yaml"):
        shutil.copy(REPO / name, root / name)
    monkeypatch.setattr(render, "REPO", root)
    return root


def code_volumes(obj) -> list[dict]:
    """Every `code` volume anywhere in a RayJob spec (submitter, head, each worker group)."""
    if isinstance(obj, list):
        return [v for x in obj for v in code_volumes(x)]
    if not isinstance(obj, dict):
        return []
    here = [obj] if obj.get("name") == "code" and "configMap" in obj else []
    return here + [v for x in obj.values() for v in code_volumes(x)]


def submit(outputs, *more: str) -> int:
    return main(["submit", "--outputs", str(outputs), "--set", "steps=50", *more])


def test_a_run_carries_the_checkouts_own_code_owned_by_its_rayjob(outputs, api, checkout,
                                                                 capsys):
    (checkout / "training" / "added_here.py").write_text("ADDED = True\n")
    assert submit(outputs) == 0
    job, = api.world["rayjobs"]
    cm, = api.world["configmaps"]
    digest = job["metadata"]["annotations"][CODE_DIGEST_ANNOTATION]
    assert digest == bundle(checkout).digest != bundle(REPO).digest
    # and its driver's environment, for the run's summary (training.pod_contract)
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"] == {CODE_DIGEST_ENV: digest}
    assert cm["metadata"]["name"] == f"{job['metadata']['name']}-code-{digest[:12]}"
    assert cm["data"]["training..added_here.py"] == "ADDED = True\n"
    assert [(o["kind"], o["name"], o["uid"]) for o in cm["metadata"]["ownerReferences"]] == [
        ("RayJob", job["metadata"]["name"], job["metadata"]["uid"])]
    # Every pod's code volume names this ConfigMap and only keys it holds.
    volumes = code_volumes(job["spec"])
    assert len(volumes) == 2  # the submitter (working_dir) and the head (scale-up watch)
    for v in volumes:
        assert v["configMap"]["name"] == cm["metadata"]["name"]
        assert {i["key"] for i in v["configMap"]["items"]} == set(cm["data"])
    posts = [path for method, path in api.requests if method == "POST"]
    assert posts[0].endswith("/rayjobs") and posts[1].endswith("/configmaps")  # owner first
    assert digest[:12] in capsys.readouterr().out


def test_a_run_whose_code_cannot_be_created_is_deleted_again(outputs, api, capsys):
    assert submit(outputs, "--dry-run") == 0
    job = next(yaml.safe_load_all(capsys.readouterr().out))
    name = code_volumes(job["spec"])[0]["configMap"]["name"]
    api.world["configmaps"].append({"metadata": {"name": name, "namespace": "ray"}})
    assert submit(outputs) == 2
    assert "already exists" in capsys.readouterr().err
    assert api.names() == []  # no run left waiting for code that never comes


def test_a_bundle_over_the_configmap_limit_is_refused_before_anything_is_created(
        outputs, api, checkout, capsys):
    """The API server's limit (ValidateConfigMap: the values' bytes over core.MaxSecretSize,
    1 MiB): exactly that many bytes pass, one more does not."""
    size = bundle(checkout).size
    (checkout / "training" / "pad.txt").write_text("x" * (CONFIGMAP_LIMIT_BYTES - size))
    assert bundle(checkout).size == CONFIGMAP_LIMIT_BYTES
    (checkout / "training" / "pad.txt").write_text("x" * (CONFIGMAP_LIMIT_BYTES - size + 1))
    with pytest.raises(CodeBundleError):
        bundle(checkout)
    assert submit(outputs) == 2
    err = capsys.readouterr().err
    assert f"training/ is {CONFIGMAP_LIMIT_BYTES + 1:,} bytes" in err and err.count("\n") == 1
    assert api.requests == []


def exec_outputs(tmp_path, api, script: str) -> str:
    """An outputs file whose kubeconfig gets its token from `script`, run as the AWS CLI (its
    `aws eks get-token` arguments)."""
    aws = tmp_path / "aws"
    aws.write_text("#!/bin/sh\n" + script)
    aws.chmod(aws.stat().st_mode | stat.S_IEXEC)
    kubeconfig = api.kubeconfig()
    kubeconfig["users"][0]["user"] = {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(aws),
        "args": ["eks", "get-token", "--cluster-name", "ray-train-dev"]}}
    return str(outputs_file(tmp_path, kubeconfig))


def test_no_aws_credentials_for_the_token_is_one_line(tmp_path, api, capsys, caplog):
    """The kubeconfig's exec plugin as `aws eks get-token` fails without credentials (the AWS
    CLI's message, exit status 255): named once, no logging line, no retries."""
    path = exec_outputs(tmp_path, api, "echo 'Unable to locate credentials. You can configure "
                        "credentials by running \"aws configure\".' >&2\nexit 255\n")
    caplog.set_level(logging.DEBUG)
    assert main(["list", "--outputs", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no credentials for the cluster: ")
    assert ("eks get-token --cluster-name ray-train-dev` failed (exit status 255: Unable to "
            "locate credentials") in err
    assert err.count("\n") == 1 and caplog.records == [] and api.requests == []


def test_a_token_the_exec_plugin_prints_is_used(tmp_path, api, capsys):
    path = exec_outputs(tmp_path, api, "echo '{\"apiVersion\": \"client.authentication.k8s.io/"
                        "v1beta1\", \"kind\": \"ExecCredential\", \"status\": {\"token\": "
                        "\"test-token\"}}'\n")
    assert main(["list", "--outputs", path]) == 0
    assert capsys.readouterr().out == "no runs\n"


def test_an_unreachable_endpoint_is_one_line_without_retry_warnings(tmp_path, caplog, capsys):
    from tests.runs.fake_api import FakeAPI

    with FakeAPI() as gone:
        kubeconfig = gone.kubeconfig()
    caplog.set_level(logging.DEBUG, logger="urllib3")
    assert main(["list", "--outputs", str(outputs_file(tmp_path, kubeconfig))]) == 2
    assert "cannot reach the cluster's API" in capsys.readouterr().err
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]


def test_an_outputs_file_short_of_a_runs_context_key_names_it(tmp_path, api, capsys):
    path = outputs_file(tmp_path, api.kubeconfig())
    data = json.loads(path.read_text())
    del data["runsContext"]["image"]
    path.write_text(json.dumps(data))
    assert main(["list", "--outputs", str(path)]) == 2
    err = capsys.readouterr().err
    assert "output runsContext has no image" in err and err.count("\n") == 1


def test_a_dry_run_from_the_stack_file_alone(capsys, monkeypatch):
    """No outputs, no Pulumi CLI, no cluster: the RayJob and the queue objects it waits in."""
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["submit", "--stack", "dev", "--dry-run", "--set", "steps=50"]) == 0
    out = capsys.readouterr().out
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["RayJob", "ResourceFlavor", "ResourceFlavor",
                                         "ClusterQueue", "LocalQueue"]
    assert out.startswith("# from Pulumi.dev.yaml alone")
    job = docs[0]
    assert job["metadata"]["name"].startswith("ray-train-dev-r")
    assert validate(job, load_schema(need(KUBERAY_CRDS / "ray.io_rayjobs.yaml"))) == []
    assert docs[-1]["metadata"]["name"] == job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert need(SHARED).exists()


def test_a_dry_run_names_the_stack_file_or_outputs(capsys):
    assert main(["submit", "--dry-run"]) == 2
    assert "--stack dev" in capsys.readouterr().err
