"""RayJob (ray.io/v1) that runs `python -m training` on the RayCluster.

A RayJob is one-shot: changing its spec does not rerun it. Its name therefore carries a hash of
the training code and settings: a change creates a new job (Pulumi replaces the object), an
unchanged `pulumi up` changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import shlex

import yaml

from stack.config import StackConfig
from stack.kube import JOB_HASH_LEN
from workloads.code_bundle import CodeBundle
from stack.kube import CODE_CONFIGMAP, CODE_MOUNT, NAMESPACE


def run_name(cfg: StackConfig) -> str:
    """Ray Train run name: stable for a model and dataset, so a new job (say, more steps)
    resumes from the previous job's latest checkpoint, while another model starts afresh."""
    key = json.dumps([cfg.training.model, cfg.training.data, cfg.training.seq_len])
    return f"{cfg.name}-run-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def entrypoint_args(cfg: StackConfig, storage_uri: str) -> list[str]:
    """The training CLI's flags for this stack (see `python -m training --help`)."""
    t = cfg.training
    args = ["python", "-m", "training", "--address", "auto",
            "--model", t.model, "--steps", str(t.steps), "--seq-len", str(t.seq_len),
            "--micro-batch-size", str(t.micro_batch_size), "--lr", str(t.lr), "--data", t.data,
            "--num-workers", str(cfg.num_workers), "--use-gpu",
            "--storage-path", storage_uri, "--name", run_name(cfg),
            "--checkpoint-every", str(t.checkpoint_every)]
    if cfg.gpu_node_count > 1:  # traffic crosses nodes: anything but EFA is a failure
        args += ["--expect-transport", "efa"]
    return args


def job_hash(bundle: CodeBundle, cfg: StackConfig, storage_uri: str) -> str:
    """Changes with the code or any setting the job runs with, and with nothing else."""
    settings = {"training": cfg.training.__dict__, "workers": cfg.num_workers,
                "image": cfg.image, "storage": storage_uri, "strict_efa": cfg.strict_efa}
    h = hashlib.sha256(bundle.digest.encode())
    h.update(json.dumps(settings, sort_keys=True, default=list).encode())
    return h.hexdigest()[:JOB_HASH_LEN]


def build_rayjob(cfg: StackConfig, bundle: CodeBundle, storage_uri: str) -> dict:
    name = f"{cfg.name}-{job_hash(bundle, cfg, storage_uri)}"
    runtime_env = {"working_dir": CODE_MOUNT}
    if cfg.training.extra_pip:
        runtime_env["pip"] = list(cfg.training.extra_pip)
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
            "activeDeadlineSeconds": cfg.training.deadline_seconds,
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
