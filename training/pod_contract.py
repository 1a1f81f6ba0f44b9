"""What the job and the pods it runs in agree on outside the flags: environment variable names the
pods and the RayJob set (workloads/raycluster.py, rayjob.py) and the job reads, and the preemption margin both size their
budgets by. Standard library only: the Pulumi program imports it."""

# The job reads the run's start time (the Ray head writes it as the run's cluster starts,
# workloads/raycluster.py) from this file: its time to first step includes node boot and pull.
RUN_STARTED_ENV = "RUN_STARTED_AT_FILE"
# A worker pod's Kubernetes node (downward API spec.nodeName, workloads/raycluster.py).
NODE_NAME_ENV = "NODE_NAME"
# The digest of the code the run carries (workloads/code_bundle.py, its RayJob's
# eks-ray-train/code-digest annotation), in the job's runtime_env (workloads/rayjob.py): the job
# records it in its summary.
CODE_DIGEST_ENV = "EKS_RAY_TRAIN_CODE_DIGEST"

# On a preemption the job moves the drain's deadline this much earlier (training/run/preemption.py:
# Ray Train's watcher polls every 5 s, its controller every 2 s), so Ray Train restarts the workers
# before their node's processes are killed; the GPU pods' drain (workloads/raycluster.py) leaves
# the emergency checkpoint what remains.
RESTART_MARGIN_S = 10.0
