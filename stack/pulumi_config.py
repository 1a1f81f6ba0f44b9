"""The stack's config as `pulumi up` hands it to the program: the only Pulumi-facing part of
`stack`. Every key of the project's namespace is read, not just the known ones, so a typo fails
the deployment instead of being ignored."""

from __future__ import annotations

import pulumi
from pulumi.runtime import config as runtime_config

from stack.config import ConfigError, StackConfig
from stack.kube import default_cluster_name
from stack.parse import parse


def raw_project_config() -> dict[str, str]:
    """Every `<project>:<key>` value the engine passed in (Pulumi.yaml defaults merged in by the
    CLI), keyed by `<key>`. The Python language host hands the program the whole stack config as
    PULUMI_CONFIG and the exec shim loads it with set_all_config (pulumi/pulumi
    sdk/python/cmd/pulumi-language-python/main.go, pulumi-language-python-exec), so reading the
    runtime's config map sees every key, known or not."""
    prefix = f"{pulumi.get_project()}:"
    values = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    return {k.removeprefix(prefix): v for k, v in values.items() if k.startswith(prefix)}


def load() -> StackConfig:
    region = pulumi.Config("aws").get("region") or ""
    return parse(raw_project_config(), region,
                 default_name=default_cluster_name(pulumi.get_project(), pulumi.get_stack()))


def secret(key: str, example: str) -> pulumi.Output[str] | None:
    """A secret key (stack.parse.SECRET_KEYS) as a secret Output, or None when the stack sets
    none (its default is ""). A plaintext value is refused: it would sit in the clear in the
    stack's config. Pulumi.yaml cannot mark the key `secret: true`: the CLI merges its default ""
    as a plaintext value and then refuses that on every stack without a value of its own
    (pulumi/pulumi pkg/workspace/config.go, mergeConfig and validateStackConfigValue)."""
    if not raw_project_config().get(key):
        return None
    if not runtime_config.is_config_secret(f"{pulumi.get_project()}:{key}"):
        raise ConfigError([f"{key}: stored in plaintext (Pulumi.{pulumi.get_stack()}.yaml or its "
                           f"environment); encrypt it: pulumi config set --secret {key} {example}"])
    return pulumi.Config().get_secret(key)
