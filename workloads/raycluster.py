"""The Ray cluster spec (ray.io/v1 RayClusterSpec) a RayJob brings up for its run: a GPU-less head
on the system node and one worker pod per GPU node, holding the node's GPUs and EFA interfaces."""

from __future__ import annotations

from stack.config import StackConfig
from stack.kube import GPU_TOLERATION, HF_TOKEN_SECRET, MLFLOW_SECRET, SERVICE_ACCOUNT
from training.pod_contract import NODE_NAME_ENV, RESTART_MARGIN_S, RUN_STARTED_ENV

# Head pod: fits beside the KubeRay operator (100m/512Mi) and the node's DaemonSets on an
# m7i.xlarge (4 vCPU, 16 GiB, ~3.9 CPU / ~14.5 GiB allocatable).
HEAD_CPU, HEAD_MEMORY_GIB = 2, 8
# Worker pod: the whole GPU node minus room for kubelet reservations and the DaemonSets
# (CNI, kube-proxy, Pod Identity agent, NVIDIA and EFA device plugins).
NODE_CPU_RESERVE = 4
NODE_MEMORY_FRACTION = 0.85
SHM_FRACTION = 0.3  # /dev/shm for NCCL and the data loaders, out of the pod's memory
NCCL_NET_EFA = "Libfabric"
# The head records when it started (once its image is on the system node, long before the GPU
# nodes are up) in this file, which the job reads (training.pod_contract.RUN_STARTED_ENV), so its time
# to first step includes node boot and image pull. In the ray-logs volume: the first start of the
# pod counts, not a container restart.
RUN_STARTED_FILE = "/tmp/ray/run-started-at"
# A GPU pod's eviction (a spot reclaim: EKS drains the node on the two-minute notice; a node
# drain; a scale-down): the kubelet sends SIGTERM to `ray start --block`, PID 1 of the container
# (KubeRay runs `bash -c "...; ray start ... --block"`, and bash execs its last command:
# ray-project/ray#64454), which drains its Ray node for RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S and
# then stops the node's processes (ray/_private/node.py, _drain_node_before_shutdown). The job
# moves that deadline RESTART_MARGIN_S earlier, saves the step it is on within what is left, and
# hands the workers back to Ray Train, which restarts them from it (training/run/preemption.py).
# No preStop hook on these pods: Kubernetes runs it before SIGTERM, and a `ray stop` there stopped
# the raylet before any drain. KubeRay sets no grace period of its own (kuberay#5004). Budgets,
# not measurements (bench/emergency_save.py measures the save):
NOTICE_S = 20  # Ray Train's watcher polls every 5 s; the step in progress ends
EMERGENCY_SAVE_S = 60  # the save in flight finished, then one synchronous save of every shard
DRAIN_S = int(RESTART_MARGIN_S) + NOTICE_S + EMERGENCY_SAVE_S
TEARDOWN_S = 15  # after the deadline: Ray Train stops the workers, the node's processes exit
GRACE_S = DRAIN_S + TEARDOWN_S  # within EC2's two-minute spot interruption notice


def worker_resources(cfg: StackConfig) -> dict:
    """Requests == limits (Guaranteed QoS), sized from the instance-facts table."""
    facts = cfg.gpu
    limits = {
        "cpu": str(facts.vcpus - NODE_CPU_RESERVE),
        "memory": f"{int(facts.memory_gib * NODE_MEMORY_FRACTION)}Gi",
        "nvidia.com/gpu": str(facts.gpus),
        "vpc.amazonaws.com/efa": str(facts.efa_interfaces),
    }
    return {"requests": dict(limits), "limits": limits}


def nccl_env(cfg: StackConfig) -> list[dict]:
    """What NCCL needs on EFA, and the logging the transport guard reads."""
    env = {
        "FI_PROVIDER": "efa",
        "NCCL_NET_PLUGIN": "ofi",  # the image's aws-ofi-nccl: libnccl-net-ofi.so
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_DEBUG": "INFO",  # NCCL's default subsystems log the channel lines the guard reads
    }
    if cfg.strict_efa:
        # Fail instead of falling back to TCP sockets. The plugin's own name since aws-ofi-nccl
        # 1.13 (`.name = "Libfabric"` in src/nccl_ofi_interface_nvidia.c; "AWS Libfabric" up to
        # 1.12, still accepted by a compatibility constructor in 1.20's
        # nccl_ofi_interface_nvidia.cpp). The image ships 1.20.
        env["NCCL_NET"] = NCCL_NET_EFA
    return [{"name": k, "value": v} for k, v in env.items()]


def _pod_env(cfg: StackConfig) -> list[dict]:
    """Every Ray pod: the Region for S3 clients, the hub token when the stack has one, and the
    MLflow server's credentials when it has them, as mlflow's own variables (whichever rank
    logs reads them from its environment: mlflow/environment_variables.py)."""
    env = [{"name": "AWS_REGION", "value": cfg.region},
           {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
               "name": HF_TOKEN_SECRET, "key": "token", "optional": True}}}]
    if cfg.mlflow_tracking_username:
        env += [{"name": f"MLFLOW_TRACKING_{key.upper()}", "valueFrom": {"secretKeyRef": {
            "name": MLFLOW_SECRET, "key": key}}} for key in ("username", "password")]
    return env


def _container(cfg: StackConfig, name: str, resources: dict, env: list[dict]) -> dict:
    return {
        "name": name,
        "image": cfg.image,
        "resources": resources,
        "env": env,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "ray-logs", "mountPath": "/tmp/ray"}],
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
    }


def _pod(container: dict, node_selector: dict, shm_gib: int, tolerations: list[dict]) -> dict:
    spec = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "nodeSelector": node_selector,
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}},
                    {"name": "ray-logs", "emptyDir": {}}],
    }
    if tolerations:
        spec["tolerations"] = tolerations
    return {"spec": spec}


def build_cluster_spec(cfg: StackConfig) -> dict:
    """The run's cluster: exactly `gpuNodeCount` workers (replicas = min = max), so the RayJob is
    submitted only once every GPU node has joined (KubeRay marks the cluster Ready when all its
    pods run: raycluster_controller.go calculateStatus)."""
    facts = cfg.gpu
    head_resources = {"cpu": str(HEAD_CPU), "memory": f"{HEAD_MEMORY_GIB}Gi"}
    head_env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                {"name": RUN_STARTED_ENV, "value": RUN_STARTED_FILE}, *_pod_env(cfg)]
    head_shm = max(1, int(HEAD_MEMORY_GIB * SHM_FRACTION))
    worker_shm = max(1, int(facts.memory_gib * NODE_MEMORY_FRACTION * SHM_FRACTION))
    head = _container(cfg, "ray-head", {"requests": dict(head_resources), "limits": head_resources},
                      head_env)
    head["lifecycle"]["postStart"] = {"exec": {"command": [
        "/bin/sh", "-c", f"[ -s {RUN_STARTED_FILE} ] || date +%s > {RUN_STARTED_FILE}"]}}
    head["ports"] = [{"containerPort": 6379, "name": "gcs"},
                     {"containerPort": 8265, "name": "dashboard"},
                     {"containerPort": 10001, "name": "client"}]
    drain = {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": str(DRAIN_S)}
    # The Kubernetes node a worker runs on (downward API, spec.nodeName): the job names it in
    # the link floor's message and in its node events (training/run/node_notices.py).
    node = {"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    worker = _container(cfg, "ray-worker", worker_resources(cfg),
                        [*nccl_env(cfg), *_pod_env(cfg), drain, node])
    del worker["lifecycle"]  # SIGTERM drains the node (above); a preStop `ray stop` would not
    worker_pod = _pod(worker, dict(cfg.gpu_node_selector), worker_shm, [GPU_TOLERATION])
    worker_pod["spec"]["terminationGracePeriodSeconds"] = GRACE_S
    return {
        "rayVersion": cfg.ray_version,
        "headGroupSpec": {
            "serviceType": "ClusterIP",  # never public: reach the dashboard by port-forward
            # No train worker may land on the head: it advertises no CPUs and no GPUs.
            "rayStartParams": {"num-cpus": "0", "num-gpus": "0", "dashboard-host": "0.0.0.0"},
            "template": _pod(head, dict(cfg.system_node_selector), head_shm, []),
        },
        "workerGroupSpecs": [{
            "groupName": "gpu",
            "replicas": cfg.gpu_node_count,
            "minReplicas": cfg.gpu_node_count,
            "maxReplicas": cfg.gpu_node_count,
            "rayStartParams": {"num-gpus": str(facts.gpus)},
            "template": worker_pod,
        }],
    }
