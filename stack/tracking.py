"""The MLflow tracking keys of a stack: the server's URI and its credentials, which reach the pods
only through a Kubernetes Secret (mlflow's own MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD,
mlflow/environment_variables.py), never through the RayJob's entrypoint or a plain value in the
stack's state. Pulumi-free."""

from __future__ import annotations

from urllib.parse import urlsplit

from training.config import TrainConfig

URI, USERNAME, PASSWORD = "mlflowTrackingUri", "mlflowTrackingUsername", "mlflowTrackingPassword"
_SET_THEM = (f"pulumi config set {USERNAME} <user> && pulumi config set --secret {PASSWORD} "
             "<password>")


def tracking_problems(uri: str | None, username: str | None, has_password: bool) -> list[str]:
    """Every problem with the three keys, naming the key and the fix; a URI with credentials in
    it is never echoed."""
    if uri and "@" in urlsplit(uri).netloc:
        return [f"{URI}: holds credentials (user:password@); in the URI they would sit in plain "
                f"text in the RayJob's entrypoint and the stack's state: remove them from the URI "
                f"and set them as keys of their own: {_SET_THEM}"]
    problems = [f"{URI}: {why.split(' ', 1)[1]}" for why in TrainConfig(
        mlflow_tracking_uri=uri).problems()] if uri else []
    if (username or has_password) and not uri:
        problems.append(f"{USERNAME} / {PASSWORD}: set without {URI}; set the tracking server too, "
                        f"or remove them")
    elif username and not has_password:
        problems.append(f"{PASSWORD}: required with {USERNAME}: pulumi config set --secret "
                        f"{PASSWORD} <password>")
    elif has_password and not username:
        problems.append(f"{USERNAME}: required with {PASSWORD}: pulumi config set {USERNAME} "
                        "<user>")
    return problems
