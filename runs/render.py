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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runs.errors import RunsError
from runs.outputs import StackOutputs
from stack.config import ConfigError, StackConfig
from stack.kube import JOB_HASH_LEN, RAYJOB_NAME_MAX, default_cluster_name
from stack.parse import SET_BY_THE_STACK, as_config_string, declared, parse
from training.options import options
from training.settings import closest, setting_key
from workloads.code_bundle import CodeBundle, CodeBundleError, bundle
from workloads.kueue import queue_objects
from workloads.rayjob import build_rayjob, job_hash

REPO = Path(__file__).resolve().parent.parent
# Every run this tool submits carries it: `cancel --all` deletes these, never the stack's own.
SUBMITTED_LABEL = {"app.kubernetes.io/managed-by": "eks-ray-train-runs"}
NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def settings(pairs: list[str]) -> tuple[dict[str, Any], list[str]]:
    """`--set key=value` pairs: camelCase keys of the stack file's `training` object, values read
    as YAML scalars (`steps=50`, `lr=1e-5`, `export=false`). Returns the settings and the
    problems: a key the training object does not take names the closest one."""
    known = [setting_key(o.name) for o in options() if o.name not in SET_BY_THE_STACK]
    out: dict[str, Any] = {}
    problems = []
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            problems.append(f"--set {pair}: expected key=value, e.g. --set steps=50")
        elif key not in known:
            owned = SET_BY_THE_STACK.get(re.sub(r"([A-Z])", r"_\1", key).lower())
            why = f"set by the stack ({owned})" if owned else \
                f"unknown training setting{closest(key, known)}"
            problems.append(f"--set {key}: {why}")
        else:
            out[key] = yaml.safe_load(text) if text else ""
    return out, problems


def project() -> str:
    return yaml.safe_load((REPO / "Pulumi.yaml").read_text())["name"]


def stack_raw(stack: str, overrides: dict[str, Any]) -> tuple[dict[str, str], str]:
    """(the stack's raw config with `training` overridden, its aws:region)."""
    path = REPO / f"Pulumi.{stack}.yaml"
    if not path.exists():
        have = sorted(p.name for p in REPO.glob("Pulumi.*.yaml"))
        raise RunsError(f"no stack file {path.name} (have {', '.join(have)})")
    config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    raw = dict(declared())
    for key, value in config.items():
        ns, _, name = key.partition(":")
        if ns == project():
            raw[name] = as_config_string(value)
    training = {**json.loads(raw.get("training") or "{}"), **overrides}
    raw["training"] = json.dumps(training)
    return raw, str(config.get("aws:region", ""))


@dataclass(frozen=True)
class Rendered:
    job: dict  # the run's RayJob
    code: CodeBundle  # the checkout's training/ it carries (its own ConfigMap)
    queue: list[dict]  # the Kueue objects it waits in (workloads/kueue.py); [] without the queue


def offline(stack: str) -> StackOutputs:
    """What a dry run uses in place of a deployed stack's outputs: the stack file's own image
    (no pull-through cache) and a bucket name that says it is not deployed."""
    raw, region = stack_raw(stack, {})
    try:
        cfg = parse(raw, region, default_name=default_cluster_name(project(), stack))
    except ConfigError as e:
        raise RunsError(str(e)) from None
    return StackOutputs(stack=stack, cluster_name=cfg.name, image=cfg.image, kubeconfig={},
                        checkpoint_storage=f"s3://{cfg.name}-checkpoints-not-deployed/runs",
                        namespace=cfg.namespace)


def _parsed(outputs: StackOutputs, overrides: dict[str, Any],
            problems: list[str]) -> StackConfig | None:
    """The stack with `overrides`, or None with its problems added to `problems`. The job's
    settings check values only once every type is right (training/settings.py from_settings),
    so a value of the wrong type would hide the next setting's bad value: those keys are left
    out and the rest checked again, and every problem is listed at once."""
    found: list[str] = []
    while True:  # each pass drops at least one key, or ends
        raw, region = stack_raw(outputs.stack, overrides)
        try:
            cfg = parse(raw, region, default_name=outputs.cluster_name)
        except ConfigError as e:
            found += [p for p in e.problems if p not in found]
            text = "\n".join(e.problems)
            mistyped = {k for k in overrides if f"training.{k}: expected" in text}
            if not mistyped:
                break
            overrides = {k: v for k, v in overrides.items() if k not in mistyped}
            continue
        if not found:
            return cfg
        break
    problems += found
    return None


def render(outputs: StackOutputs, pairs: list[str], name: str | None = None) -> Rendered:
    """The run's RayJob and what goes with it. Raises RunsError listing every problem of the
    settings, one a line, as the stack and the job list theirs (training.errors.ConfigError)."""
    overrides, problems = settings(pairs)
    cfg = _parsed(outputs, overrides, problems)
    if problems or cfg is None:
        raise RunsError(str(ConfigError(problems)))
    try:
        code = bundle(REPO)
    except CodeBundleError as e:
        raise RunsError(str(e)) from None
    cfg = dataclasses.replace(cfg, image=outputs.image)
    if name is None:
        name = f"{cfg.name}-r{job_hash(code, cfg, outputs.checkpoint_storage)[:JOB_HASH_LEN - 1]}"
    elif not NAME.match(name) or len(name) > RAYJOB_NAME_MAX:
        raise RunsError(f"--name {name}: lowercase letters, digits and '-', starting with a "
                        f"letter, at most {RAYJOB_NAME_MAX} characters")
    job = build_rayjob(cfg, code, outputs.checkpoint_storage, name=name)
    job["metadata"].setdefault("labels", {}).update(SUBMITTED_LABEL)
    return Rendered(job, code, queue_objects(cfg) if cfg.queue else [])
