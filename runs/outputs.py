"""The stack's outputs, as `pulumi stack output --json --show-secrets` prints them: from a file, or
from the Pulumi CLI itself. Only what a run needs is kept, in `StackOutputs`."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runs.errors import RunsError

NEEDED = ("kubeconfig", "checkpointStorage", "rayNamespace", "runsContext")
CONTEXT = ("stack", "clusterName", "image")  # runsContext's keys (program.py export)


@dataclass(frozen=True)
class StackOutputs:
    stack: str  # the stack's name: its file is Pulumi.<stack>.yaml
    cluster_name: str  # StackConfig.name (clusterName, or its default)
    image: str  # the Ray image as the nodes pull it (through the stack's cache)
    kubeconfig: dict
    checkpoint_storage: str
    namespace: str


def from_json(data: object, where: str) -> StackOutputs:
    """Raises RunsError naming the missing outputs (a stack deployed before `runsContext`)."""
    if not isinstance(data, dict):
        raise RunsError(f"{where}: not the JSON object `pulumi stack output --json` prints")
    missing = [k for k in NEEDED if not data.get(k)]
    if missing:
        raise RunsError(f"{where}: no output {', '.join(missing)}; run `pulumi up` with this "
                        f"version of the program first")
    ctx, kubeconfig = data["runsContext"], data["kubeconfig"]
    lacking = [k for k in CONTEXT if not isinstance(ctx, dict) or not ctx.get(k)]
    if lacking:
        raise RunsError(f"{where}: output runsContext has no {', '.join(lacking)}; run "
                        "`pulumi up` with this version of the program first")
    try:
        kubeconfig = json.loads(kubeconfig) if isinstance(kubeconfig, str) else kubeconfig
    except json.JSONDecodeError:
        raise RunsError(f"{where}: kubeconfig is not JSON; use --show-secrets") from None
    return StackOutputs(stack=ctx["stack"], cluster_name=ctx["clusterName"], image=ctx["image"],
                        kubeconfig=kubeconfig, checkpoint_storage=data["checkpointStorage"],
                        namespace=data["rayNamespace"])


def from_file(path: Path) -> StackOutputs:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise RunsError(f"--outputs {path}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise RunsError(f"--outputs {path}: not JSON ({e.msg}, line {e.lineno})") from None
    return from_json(data, f"--outputs {path}")


def from_pulumi(stack: str | None, cwd: Path) -> StackOutputs:
    """Asks the Pulumi CLI (logged in to the stack's backend) for the outputs."""
    if shutil.which("pulumi") is None:
        raise RunsError("no Pulumi CLI on PATH: pass --outputs FILE "
                        "(pulumi stack output --json --show-secrets > FILE, where it is)")
    cmd = ["pulumi", "stack", "output", "--json", "--show-secrets",
           *(["--stack", stack] if stack else [])]
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise RunsError(f"{' '.join(cmd)}: {last}")
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError as e:
        raise RunsError(f"{' '.join(cmd)}: printed no JSON ({e.msg})") from None
    return from_json(data, f"stack {stack or '(selected)'}")
