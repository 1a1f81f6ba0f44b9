"""Code that runs in the Ray pods (and on a laptop): the FSDP2 training job. Never imports Pulumi."""
