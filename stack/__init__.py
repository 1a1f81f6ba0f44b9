"""The contract between the layers, Pulumi-free: the stack config schema and its validation
(`config`), the tables of versions, instance facts and prices (`catalog`), and the Kubernetes
names, labels, taints and limits that `infra/` and `workloads/` share (`kube`).

`infra/` and `workloads/` read this package and never each other.
"""
