"""A stack's outputs file, as `pulumi stack output --json --show-secrets` prints it, for the dev
stack pointing at a fake API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runs.fake_api import FakeAPI

S3 = "s3://eks-ray-train-dev-ckpt/runs"
IMAGE = ("123456789012.dkr.ecr.us-west-2.amazonaws.com/eks-ray-train-dev/"
         "deep-learning-containers/ray:train-ml-cuda-v1.1")
CLUSTER = "ray-train-dev"  # the dev stack file sets clusterName


def outputs_file(tmp_path: Path, kubeconfig: dict) -> Path:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps({
        "clusterName": CLUSTER, "region": "us-west-2", "kubeconfig": json.dumps(kubeconfig),
        "checkpointStorage": S3, "rayNamespace": "ray", "rayJob": f"{CLUSTER}-0123456789",
        "runsContext": {"stack": "dev", "clusterName": CLUSTER, "image": IMAGE}}))
    return path


@pytest.fixture()
def api():
    with FakeAPI() as fake:
        yield fake


@pytest.fixture()
def outputs(api, tmp_path) -> Path:
    return outputs_file(tmp_path, api.kubeconfig())
