"""RayJob (ray.io/v1) that brings up its own Ray cluster, runs `python -m training` on it, and
takes the cluster down when the job ends, so GPU nodes run (and bill) only while a job does.

A RayJob is one-shot: changing its spec does not rerun it. Its name therefore carries a hash of
the training code and settings: a change creates a new job (Pulumi replaces the object), an
unchanged `pulumi up` changes nothing.

What each field does is read from KubeRay v1.7.0's `ray-operator/controllers/ray/
rayjob_controller.go` (RJC) and `utils/validation.go` (VAL).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex

import yaml

from stack.catalog import LM_EVAL_CLIENT, MLFLOW_CLIENT, PEFT_CLIENT
from stack.config import StackConfig
from stack.kube import CODE_DIGEST_ANNOTATION, CODE_MOUNT, JOB_HASH_LEN, RUN_START_BUDGET_S
from training.config import TrainConfig
from training.flags import render
from training.pod_contract import CODE_DIGEST_ENV
from training.run_names import run_key
from workloads.code_bundle import CodeBundle
from workloads.kueue import queued
from workloads.raycluster import build_cluster_spec
from workloads.scaleup_watch import with_cold_start

# After the job ends (RJC handleShutdownAfterJobFinishes: status.endTime + this), the cluster is
# deleted; until then its dashboard and Ray logs can still be read. The submitter Job, with the
# driver's output, is kept until the RayJob itself is deleted. Without the queue only: a queued
# run's cluster goes at once, for the next run's head (workloads/kueue.py `queued`).
LOGS_GRACE_S = 300
# Submission retries of the submitter Job (RJC createNewK8sJob defaults to 2; its command checks
# `ray job status` before `ray job submit`, so a retry never submits twice: common/job.go).
SUBMITTER_RETRIES = 2


def run_name(cfg: StackConfig) -> str:
    """Ray Train run name: stable for a model and dataset, so a new job (say, more steps)
    resumes from the previous job's latest checkpoint, while another model starts afresh."""
    # The key is a local run's too (training/run_names.py): LoRA and DPO are runs of their own.
    return f"{cfg.name}-run-{run_key(cfg.training)}"


def job_settings(cfg: StackConfig, storage_uri: str) -> TrainConfig:
    """The job's settings on this stack: the stack's `training` object (validated by TrainConfig)
    plus what the stack decides (stack.parse.SET_BY_THE_STACK)."""
    return dataclasses.replace(
        cfg.training, num_workers=cfg.num_workers, use_gpu=True, storage_path=storage_uri,
        name=run_name(cfg), address="auto", mlflow_tracking_uri=cfg.mlflow_tracking_uri,
        # Traffic crosses nodes: anything but EFA is a failure, and a link below the instance
        # type's floor is warned about, or with strictEfa stops the run before its first step.
        expect_transport="efa" if cfg.gpu_node_count > 1 else "any",
        efa_floor_gbps=cfg.gpu.efa_floor_gbps if cfg.gpu_node_count > 1 else None,
        strict_efa=cfg.strict_efa)


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


def head_service(rayjob_name: str) -> str:
    """The per-run cluster's head Service (dashboard :8265), named after the RayJob, not the
    cluster (utils.GenerateHeadServiceName for RayJobCRD, common/job.go BuildHeadServiceForRayJob)."""
    return f"{rayjob_name}-head-svc"


def build_rayjob(cfg: StackConfig, bundle: CodeBundle, storage_uri: str,
                 name: str | None = None) -> dict:
    """The run's RayJob; with `queue` on, labelled for Kueue's LocalQueue and created suspended
    (workloads/kueue.py `queued`). `python -m runs submit` renders its runs with this too, under
    a `name` of its own (runs/render.py)."""
    name = name or f"{cfg.name}-{job_hash(bundle, cfg, storage_uri)}"
    # env_vars reach the entrypoint: Ray's job manager starts the JobSupervisor actor with the
    # job's runtime_env, and the supervisor runs the entrypoint with its own environment (ray
    # 2.58.0 dashboard/modules/job/job_manager.py submit_job, job_supervisor.py run).
    runtime_env = {"working_dir": CODE_MOUNT, "env_vars": {CODE_DIGEST_ENV: bundle.digest}}
    pip = [*cfg.extra_pip, *([MLFLOW_CLIENT] if cfg.mlflow_tracking_uri else []),
           *([PEFT_CLIENT] if cfg.training.lora_rank else []),
           *([LM_EVAL_CLIENT] if cfg.training.harness_tasks else [])]
    if pip:
        runtime_env["pip"] = pip
    return queued({
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": cfg.namespace,
                     "annotations": {CODE_DIGEST_ANNOTATION: bundle.digest}},
        "spec": {
            "entrypoint": shlex.join(entrypoint_args(cfg, storage_uri)),
            # A cluster of its own (no clusterSelector): created with the job, submitted to once
            # all its pods run, deleted after it (shutdownAfterJobFinishes). The deadlines then
            # end the run and free the GPUs; with clusterSelector they only mark the RayJob
            # Failed while the Ray job keeps running (RJC skips deletion for clusterSelector).
            # No deletionStrategy: VAL rejects its deletionRules beside shutdownAfterJobFinishes.
            # The head also reports the cold start and ends a run whose GPU nodes cannot come.
            "rayClusterSpec": with_cold_start(build_cluster_spec(cfg), cfg, bundle, name),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": LOGS_GRACE_S,
            "activeDeadlineSeconds": cfg.job_deadline_seconds,
            "preRunningDeadlineSeconds": RUN_START_BUDGET_S,  # node boot + image pull
            "runtimeEnvYAML": yaml.safe_dump(runtime_env, sort_keys=True),
            "submitterConfig": {"backoffLimit": SUBMITTER_RETRIES},
            "submitterPodTemplate": {"spec": {
                "restartPolicy": "Never",
                "nodeSelector": dict(cfg.system_node_selector),
                "containers": [{
                    "name": "ray-job-submitter",
                    "image": cfg.image,
                    "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                  "limits": {"cpu": "500m", "memory": "1Gi"}},
                    "volumeMounts": [{"name": "code", "mountPath": CODE_MOUNT}],
                }],
                "volumes": [bundle.volume(name)],
            }},
        },
    }, cfg)
