"""Launch-template user data for the AL2023 nodes: a nodeadm NodeConfig that turns on SOCI
parallel pull (pure: the MIME document as text, tested by parsing it).

- EKS merges its own user data (the NodeConfig with the cluster's endpoint, CA and CIDR) into a
  managed node group's launch template user data, which for Amazon Linux AMIs must therefore be a
  MIME multi-part archive, and must leave the node's bootstrap to EKS
  (EKS user guide, nodes/launch-templates "Amazon EC2 user data": "Don't specify any commands in
  your user data that starts or modifies kubelet"). nodeadm reads every
  `application/node.eks.aws` part and merges them (amazon-eks-ami nodeadm/doc/examples.md;
  internal/configprovider/mime.go ParseMultipart).
- `featureGates: {FastImagePull: true}` makes nodeadm configure containerd with the SOCI
  snapshotter in parallel pull and unpack mode (nodeadm/internal/containerd/config.go
  UseSOCISnapshotter), for ordinary OCI images: no SOCI index needed. The gate was added as
  `AggressiveImagePull` in AMI release v20250813 and renamed `FastImagePull` in v20250821
  (amazon-eks-ami #2381): every AL2023 AMI of the Kubernetes versions in stack/catalog.py is
  newer. nodeadm ignores it below 4 vCPUs or 7 GiB of memory (UseSOCISnapshotter) and recommends
  at least 600 MiB/s of root volume throughput (infra/root_volumes.py)."""

from __future__ import annotations

import base64

import yaml

from stack.catalog import InstanceFacts

BOUNDARY = "//eks-ray-train//"
NODECONFIG_CONTENT_TYPE = "application/node.eks.aws"
# UseSOCISnapshotter: totalMemory >= 7 GiB && totalCPUMillicores >= 4000.
FAST_PULL_MIN_VCPUS, FAST_PULL_MIN_MEMORY_GIB = 4, 7


def fast_image_pull_applies(facts: InstanceFacts) -> bool:
    """Whether nodeadm honours FastImagePull on this instance type."""
    return facts.vcpus >= FAST_PULL_MIN_VCPUS and facts.memory_gib >= FAST_PULL_MIN_MEMORY_GIB


def node_config() -> dict:
    """Only what this stack adds; EKS's own part carries the cluster."""
    return {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig",
            "spec": {"featureGates": {"FastImagePull": True}}}


def node_user_data(facts: InstanceFacts) -> str | None:
    """The MIME multi-part user data for a node of this type, or None where nodeadm would ignore
    the gate (no user data beats a setting that does nothing)."""
    if not fast_image_pull_applies(facts):
        return None
    return (f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{BOUNDARY}"\n\n'
            f"--{BOUNDARY}\nContent-Type: {NODECONFIG_CONTENT_TYPE}\n\n"
            f"---\n{yaml.safe_dump(node_config(), sort_keys=False)}\n"
            f"--{BOUNDARY}--\n")


def launch_template_user_data(facts: InstanceFacts) -> str | None:
    """The launch template's `user_data`: EC2 takes it base64-encoded."""
    text = node_user_data(facts)
    return base64.b64encode(text.encode()).decode() if text is not None else None
