"""The contract between the layers, Pulumi-free: the stack config schema (`config`), its parsing
from the raw Pulumi config (`parse`) and its checks (`validation`), the tables of versions,
instance facts, prices and capacity types (`catalog`), and the Kubernetes names, labels, taints
and limits that `infra/` and `workloads/` share (`kube`).

`infra/` and `workloads/` read this package and never each other.
"""
