"""`python -m runs`: submit, list, logs, show and cancel fine-tuning runs on the stack's cluster.
Any failure is one `error:` line on stderr and exit status 2, before anything is created."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from runs import outputs, render, status
from runs.errors import RunsError
from runs.kube import Kube
from workloads.rbac import run_rbac

# Every run this tool submits carries it: `cancel --all` deletes these, never the stack's own.
SUBMITTED_LABEL = {"app.kubernetes.io/managed-by": "eks-ray-train-runs"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runs", description=__doc__.splitlines()[0])
    where = argparse.ArgumentParser(add_help=False)
    src = where.add_mutually_exclusive_group()
    src.add_argument("--stack", help="the stack (its outputs from the Pulumi CLI)")
    src.add_argument("--outputs", type=Path, metavar="FILE",
                     help="what `pulumi stack output --json --show-secrets` printed")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("submit", parents=[where], help="queue a run of the stack's job")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a `training` setting of the stack file, camelCase (steps=50)")
    s.add_argument("--name", help="the run's RayJob name (default: from its settings)")
    s.add_argument("--dry-run", action="store_true", help="print the RayJob; create nothing")
    sub.add_parser("list", parents=[where], help="every run: state, step, loss, cost")
    for cmd, text in (("logs", "the run's job output"), ("show", "the run's JSON summary")):
        c = sub.add_parser(cmd, parents=[where], help=text)
        c.add_argument("name")
        if cmd == "logs":
            c.add_argument("-f", "--follow", action="store_true")
    c = sub.add_parser("cancel", parents=[where],
                       help="delete a run and its Ray cluster (checkpoints stay)")
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("name", nargs="?")
    which.add_argument("--all", action="store_true", help="every run `submit` created")
    return p


def _outputs(args: argparse.Namespace) -> outputs.StackOutputs:
    if args.outputs is not None:
        return outputs.from_file(args.outputs)
    return outputs.from_pulumi(args.stack, render.REPO)


def submit(args: argparse.Namespace, out: outputs.StackOutputs) -> None:
    job = render.render(out, render.settings(args.set), args.name)
    job["metadata"].setdefault("labels", {}).update(SUBMITTED_LABEL)
    if args.dry_run:
        print(yaml.safe_dump(job, sort_keys=False), end="")
        return
    kube = Kube(out.kubeconfig, out.namespace)
    created = kube.create(job)
    kube.grant(run_rbac(created))  # its head reads its own RayJob (cold start, scale-up watch)
    print(f"submitted {job['metadata']['name']}: `python -m runs list` shows it queued until "
          f"the cluster has room")


def list_runs(kube: Kube) -> None:
    jobs = sorted(kube.rayjobs(), key=lambda j: j["metadata"].get("creationTimestamp", ""))
    positions = status.queue_positions(jobs)
    rows = []
    for job in jobs:
        name = job["metadata"]["name"]
        pod = None if name in positions else kube.submitter_pod(name)
        rows.append(status.row(job, positions.get(name), kube.log(pod) if pod else ""))
    print(status.table(rows) if rows else "no runs")


def _log(kube: Kube, name: str) -> tuple[str | None, str]:
    kube.rayjob(name)  # an unknown run fails here, by name
    pod = kube.submitter_pod(name)
    return pod, kube.log(pod) if pod else ""


def logs(kube: Kube, name: str, follow: bool) -> None:
    pod, text = _log(kube, name)
    if pod is None:
        raise RunsError(f"run {name}: no job output yet (queued or starting: "
                        f"`python -m runs list`)")
    if not follow:
        print(text, end="")
        return
    for chunk in kube.follow(pod):
        print(chunk, end="", flush=True)


def show(kube: Kube, name: str) -> None:
    job = kube.rayjob(name)
    found = status.summary(_log(kube, name)[1])
    if found is None:
        raise RunsError(f"run {name}: no summary yet ({status.state(job)})")
    print(json.dumps(found, indent=2))


def cancel(kube: Kube, name: str | None) -> None:
    names = [name] if name else [
        j["metadata"]["name"] for j in kube.rayjobs()
        if SUBMITTED_LABEL.items() <= (j["metadata"].get("labels") or {}).items()]
    for n in names:
        kube.delete(n)
        print(f"cancelled {n} (its checkpoints stay; submitting the same settings resumes)")
    if not names:
        print("no submitted runs")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        out = _outputs(args)
        if args.command == "submit":
            submit(args, out)
            return 0
        kube = Kube(out.kubeconfig, out.namespace)
        if args.command == "list":
            list_runs(kube)
        elif args.command == "logs":
            logs(kube, args.name, args.follow)
        elif args.command == "show":
            show(kube, args.name)
        else:
            cancel(kube, None if args.all else args.name)
    except RunsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
