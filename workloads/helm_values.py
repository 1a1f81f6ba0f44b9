"""Values for the three Helm charts: each add-on on the nodes it belongs to."""

from __future__ import annotations

from stack.kube import GPU_LABELS, GPU_TOLERATION, SYSTEM_LABELS


def kuberay_operator() -> dict:
    """On the system node. CRDs come from the pinned release (see workloads/addons.py)."""
    return {"nodeSelector": dict(SYSTEM_LABELS),
            "resources": {"requests": {"cpu": "100m", "memory": "512Mi"},
                          "limits": {"cpu": "100m", "memory": "512Mi"}}}


def nvidia_device_plugin() -> dict:
    """Only on GPU nodes, tolerating their taint. The pinned chart (>= 0.19.3) leaves MOFED off,
    so /dev/infiniband/uverbs* stay with the EFA plugin."""
    return {"nodeSelector": {"nvidia.com/gpu.present": GPU_LABELS["nvidia.com/gpu.present"]},
            "tolerations": [GPU_TOLERATION]}


def efa_device_plugin() -> dict:
    """On EFA nodes, tolerating the GPU taint (the chart only tolerates its own EFA taint)."""
    return {"nodeSelector": {"vpc.amazonaws.com/efa.present":
                             GPU_LABELS["vpc.amazonaws.com/efa.present"]},
            "tolerations": [GPU_TOLERATION]}
