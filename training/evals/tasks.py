"""--harness-tasks resolved the way `lm_eval run --tasks` resolves them (lm_eval/config/
evaluate_config.py `process_tasks`, 0.4.13): a task or group name is matched by lm-eval's
TaskManager, a `.yaml` path is loaded as a task config (its `!function`s resolved beside it), a
folder contributes every `*.yaml` in it. The driver resolves them before Ray starts, so an unknown
name fails before anything is spent; the workers resolve them again after the export. Only
names need lm-eval's index of its own tasks; paths alone skip it."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

from training.config import ConfigError


def entries(spec: str) -> list[str]:
    """The comma-separated entries of --harness-tasks, stripped, empty ones dropped."""
    return [t.strip() for t in spec.split(",") if t.strip()]


def resolve(spec: str) -> tuple[list[str | dict[str, Any]], Any]:
    """(what `lm_eval.simple_evaluate(tasks=...)` takes, the TaskManager to pass with it); every
    entry that names nothing is reported at once, as one ConfigError naming the flag."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    named = [e for e in entries(spec) if not (e.endswith((".yaml", ".yml")) or Path(e).is_dir())]
    # Indexing lm-eval's thousands of task YAMLs takes seconds to minutes: only for names.
    manager = TaskManager(include_defaults=bool(named))
    tasks: list[str | dict[str, Any]] = []
    missing = []
    for entry in entries(spec):
        path = Path(entry)
        if entry.endswith((".yaml", ".yml")) or path.is_dir():
            files = sorted(glob.glob(str(path / "*.yaml"))) if path.is_dir() else \
                ([str(path.absolute())] if path.is_file() else [])
            found = [load_yaml(f, resolve_func=True) for f in files]
        else:
            found = manager.match_tasks([entry])
        tasks += [t for t in found if t not in tasks]
        if not found:
            missing.append(entry)
    if missing:
        raise ConfigError([f"--harness-tasks: no lm-eval task, group, task YAML or folder of "
                           f"them named {', '.join(map(repr, missing))} (`lm_eval ls tasks` "
                           "lists the names; a path must exist on the driver)"])
    return tasks, manager


def checked(cfg):
    """The driver's check before Ray starts (driver/plan.py): --harness-tasks resolve (or one
    ConfigError), their paths made absolute, since the workers run in another directory."""
    import dataclasses
    import os

    if cfg.harness_tasks is None:
        return cfg
    fixed = ",".join(os.path.abspath(e) if os.path.exists(e) else e
                     for e in entries(cfg.harness_tasks))
    resolve(fixed)
    return dataclasses.replace(cfg, harness_tasks=fixed)
