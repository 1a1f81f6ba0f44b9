"""RayJob (ray.io/v1) that runs `python -m training` on the RayCluster.

A RayJob is one-shot: changing its spec does not rerun it. Its name therefore carries a hash of
the training code and settings: a change creates a new job (Pulumi replaces the object), an
unchanged `pulumi up` changes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex

import yaml

from stack.config import StackConfig
from stack.kube import CODE_CONFIGMAP, CODE_MOUNT, JOB_HASH_LEN, NAMESPACE
from training.config import TrainConfig
from training.flags import render
from workloads.code_bundle import CodeBundle


def run_name(cfg: StackConfig) -> str:
    """Ray Train run name: stable for a model and dataset, so a new job (say, more steps)
    resumes from the previous job's latest checkpoint, while another model starts afresh."""
    key = json.dumps([cfg.training.model, cfg.training.data, cfg.training.seq_len])
    return f"{cfg.name}-run-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def job_settings(cfg: StackConfig, storage_uri: str) -> TrainConfig:
    """The job's settings on this stack: the stack's `training` object (validated by TrainConfig)
    plus what the stack decides (stack.config.SET_BY_THE_STACK)."""
    return dataclasses.replace(
        cfg.training, num_workers=cfg.num_workers, use_gpu=True, storage_path=storage_uri,
        name=run_name(cfg), address="auto",
        # Traffic crosses nodes: anything but EFA is a failure.
        expect_transport="efa" if cfg.gpu_node_count > 1 else "any")


def entrypoint_args(cfg: StackConfig, storage_uri: str) -> list[str]:
    """`python -m training` with the flags of this stack's job settings."""
    return ["python", "-m", "training", *render(job_settings(cfg, storage_uri))]


def job_hash(bundle: CodeBundle, cfg: StackConfig, storage_uri: str) -> str:
    """Changes with the code or any setting the job runs with, and with nothing else."""
    settings = {"job": entrypoint_args(cfg, storage_uri), "extra_pip": cfg.extra_pip,
                "image": cfg.image, "strict_efa": cfg.strict_efa}
    h = hashlib.sha256(bundle.digest.encode())
    h.update(json.dumps(settings, sort_keys=True, default=list).encode())
    return h.hexdigest()[:JOB_HASH_LEN]


def build_rayjob(cfg: StackConfig, bundle: CodeBundle, storage_uri: str) -> dict:
    name = f"{cfg.name}-{job_hash(bundle, cfg, storage_uri)}"
    runtime_env = {"working_dir": CODE_MOUNT}
    if cfg.extra_pip:
        runtime_env["pip"] = list(cfg.extra_pip)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "entrypoint": shlex.join(entrypoint_args(cfg, storage_uri)),
            # Run on the stack's long-lived RayCluster rather than a per-job cluster: the GPU
            # nodes and the pulled image stay warm between jobs.
            "clusterSelector": {"ray.io/cluster": cfg.name},
            "runtimeEnvYAML": yaml.safe_dump(runtime_env, sort_keys=True),
            "activeDeadlineSeconds": cfg.job_deadline_seconds,
            "preRunningDeadlineSeconds": 1800,
            "submitterConfig": {"backoffLimit": 0},
            "submitterPodTemplate": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "ray-job-submitter",
                    "image": cfg.image,
                    "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                  "limits": {"cpu": "500m", "memory": "1Gi"}},
                    "volumeMounts": [{"name": "code", "mountPath": CODE_MOUNT}],
                }],
                "volumes": [{"name": "code", "configMap": {"name": CODE_CONFIGMAP,
                                                           "items": bundle.items}}],
            }},
        },
    }
