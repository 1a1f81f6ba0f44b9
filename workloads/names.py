"""Names shared by the Kubernetes objects and the AWS resources that refer to them."""

NAMESPACE = "ray"
SERVICE_ACCOUNT = "ray-train"  # head and workers; Pod Identity maps it to the bucket role
HF_TOKEN_SECRET = "hf-token"
CODE_CONFIGMAP = "training-code"
CODE_MOUNT = "/home/ray/code"  # in the submitter pod; `ray job submit` uploads it as working_dir
