"""Kubernetes objects: pure builders (typed config in, dict out) and thin Pulumi components.

Never imports torch or ray.
"""
