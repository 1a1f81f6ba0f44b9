"""Node health: the EKS node monitoring agent add-on and the node groups' auto repair, as data
(typed config in, add-on configuration and repair block out), tested without Pulumi's engine.

What the agent watches (aws/eks-node-monitoring-agent v1.7.0): a DaemonSet on every Linux node
reads kernel, systemd and container-runtime logs and sets one NodeCondition per category
(KernelReady, NetworkingReady, StorageReady, ContainerRuntimeReady, AcceleratedHardwareReady:
pkg/conditions/conditions.go). On NVIDIA nodes it reads the GPUs only through DCGM: it connects as
a DCGM client in standalone mode to an `nv-hostengine` on localhost:5555
(monitors/nvidia/dcgm/dcgm_client.go), which the add-on's second DaemonSet, `dcgm-server`, runs.
XID errors arrive as DCGM policy violations (dcgm_policies.go: the well-known codes, e.g. 48
double-bit ECC, 79 fallen off the bus, 119/120 GSP, set AcceleratedHardwareReady=False; others
are Kubernetes events only), beside DCGM's health checks, field watches, device count and active
diagnostics every 5 minutes (monitors/nvidia/monitor.go). Without a reachable host engine the
agent reports DCGMError and sees no XID at all.

The agent needs no IAM role or Pod Identity association: it calls no AWS API (the AWS SDK is in
its e2e tests only; IMDS it reaches on the host network, hostNetwork: true in the chart's
DaemonSet, within the launch templates' hop limit of 1; log uploads go to presigned S3 URLs,
pkg/packet_capture/upload.go) and holds only Kubernetes RBAC (templates/clusterrole.yaml).

What it costs: the add-on and repair carry no AWS charge; the agent's pod requests 10m CPU and
30Mi memory on every node (chart values.yaml nodeAgent.resources), `dcgm-server` sets none."""

from __future__ import annotations

from stack.kube import GPU_TOLERATION

MONITORING_AGENT_ADDON = "eks-node-monitoring-agent"
# The add-on's configuration schema (charts/configuration.schema.json, what EKS validates
# configurationValues against) names the DCGM DaemonSet's settings `dcgmAgent`.
DCGM_AGENT = "dcgmAgent"


def monitoring_agent_configuration() -> dict:
    """The add-on's configurationValues. The node agent tolerates every taint already (chart
    values.yaml nodeAgent.tolerations: [{operator: Exists}]), so it runs on the system and the GPU
    nodes; `dcgm-server` tolerates none by default (dcgmAgent.tolerations: []), so on our tainted
    GPU nodes it would never run and the agent would be blind to the GPUs. It gets the GPU
    taint's toleration; its node affinity already limits it to NVIDIA instance types."""
    return {DCGM_AGENT: {"tolerations": [dict(GPU_TOLERATION)]}}


def repair_config(enabled: bool) -> dict:
    """A managed node group's nodeRepairConfig, declared on or off and never left out: the aws
    provider's node_repair_config is Optional+Computed (terraform-provider-aws
    internal/service/eks/node_group.go), so a group declared without it keeps whatever EKS holds,
    and turning repair off must send enabled=false. Not ForceNew: a change goes out in place, in
    UpdateNodegroupConfig, with no roll and without the scaling block unless that changed too.

    What EKS then does (EKS user guide node-repair): a node whose AcceleratedHardwareReady is
    False for 10 minutes is rebooted or replaced by the reason's action (XID 48/63/64/95:
    reboot; 74/79/119/120/140, double-bit and NVLink errors: replace); KernelReady,
    NetworkingReady, ContainerRuntimeReady or kubelet Ready failing for 30 minutes: replaced. It
    halts repairs while a zonal shift is on, or where a group of more than five nodes has more
    than 20% unhealthy. The defaults serve us: no thresholds or overrides are set."""
    return {"enabled": enabled}
