"""A submitted run's RayJob, rendered as the stack renders its own: the stack file (Pulumi.yaml's
defaults under it, as the Pulumi CLI merges them), its `training` object overridden by `--set`,
validated by the same contract (stack/parse.py, TrainConfig), built by the stack's own builder
(workloads/rayjob.py) with the image and bucket from the stack's outputs.

A submitted run's name is `<clusterName>-r<9 hex>`: never a name the stack's own RayJob can have
(`<clusterName>-<10 hex>`), so a `pulumi up` whose settings match a submitted run's creates its own
RayJob beside it instead of adopting it (server-side apply upserts an object of the same name)
and later deleting it on a replace."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import yaml

from runs.errors import RunsError
from runs.outputs import StackOutputs
from stack.config import ConfigError
from stack.kube import JOB_HASH_LEN, RAYJOB_NAME_MAX
from stack.parse import SET_BY_THE_STACK, as_config_string, declared, parse
from training.config import options
from training.settings import closest, setting_key
from workloads.code_bundle import CodeBundleError, bundle
from workloads.rayjob import build_rayjob, job_hash

REPO = Path(__file__).resolve().parent.parent
NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def settings(pairs: list[str]) -> dict[str, Any]:
    """`--set key=value` pairs: camelCase keys of the stack file's `training` object, values read
    as YAML scalars (`steps=50`, `lr=1e-5`, `export=false`). A key the training object does not
    take is refused naming the closest one."""
    known = [setting_key(o.name) for o in options() if o.name not in SET_BY_THE_STACK]
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise RunsError(f"--set {pair}: expected key=value, e.g. --set steps=50")
        if key not in known:
            owned = SET_BY_THE_STACK.get(re.sub(r"([A-Z])", r"_\1", key).lower())
            why = f"set by the stack ({owned})" if owned else \
                f"unknown training setting{closest(key, known)}"
            raise RunsError(f"--set {key}: {why}")
        out[key] = yaml.safe_load(text) if text else ""
    return out


def stack_raw(stack: str, overrides: dict[str, Any]) -> tuple[dict[str, str], str]:
    """(the stack's raw config with `training` overridden, its aws:region)."""
    path = REPO / f"Pulumi.{stack}.yaml"
    if not path.exists():
        have = sorted(p.name for p in REPO.glob("Pulumi.*.yaml"))
        raise RunsError(f"no stack file {path.name} (have {', '.join(have)})")
    config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    project = yaml.safe_load((REPO / "Pulumi.yaml").read_text())["name"]
    raw = dict(declared())
    for key, value in config.items():
        ns, _, name = key.partition(":")
        if ns == project:
            raw[name] = as_config_string(value)
    training = {**json.loads(raw.get("training") or "{}"), **overrides}
    raw["training"] = json.dumps(training)
    return raw, str(config.get("aws:region", ""))


def render(outputs: StackOutputs, overrides: dict[str, Any], name: str | None = None) -> dict:
    """The run's RayJob manifest. Raises RunsError (the stack's problems, one per line joined)."""
    raw, region = stack_raw(outputs.stack, overrides)
    try:
        cfg = parse(raw, region, default_name=outputs.cluster_name)
        code = bundle(REPO)
    except (ConfigError, CodeBundleError) as e:
        raise RunsError(str(e).replace("\n", "; ")) from None
    cfg = dataclasses.replace(cfg, image=outputs.image)
    if name is None:
        name = f"{cfg.name}-r{job_hash(code, cfg, outputs.checkpoint_storage)[:JOB_HASH_LEN - 1]}"
    elif not NAME.match(name) or len(name) > RAYJOB_NAME_MAX:
        raise RunsError(f"--name {name}: lowercase letters, digits and '-', starting with a "
                        f"letter, at most {RAYJOB_NAME_MAX} characters")
    return build_rayjob(cfg, code, outputs.checkpoint_storage, name=name)
