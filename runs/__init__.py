"""`python -m runs`: fine-tuning runs submitted, listed, followed and cancelled against the stack's
cluster without `pulumi up`. Pulumi-free: it reads the stack file and the stack's outputs, renders
the RayJob with the stack's own builder (workloads/rayjob.py) and talks to the Kubernetes API
through the official `kubernetes` client. Never imports infra/, torch or Ray."""
