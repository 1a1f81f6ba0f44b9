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
from stack.kube import CODE_DIGEST_ANNOTATION
from workloads.code_bundle import configmap
from workloads.rbac import run_rbac

SUBMITTED_LABEL = render.SUBMITTED_LABEL


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runs", description=__doc__.splitlines()[0])
    where = argparse.ArgumentParser(add_help=False)
    src = where.add_mutually_exclusive_group()
    src.add_argument("--stack", help="the stack (its outputs from the Pulumi CLI; with "
                     "submit --dry-run, its stack file alone)")
    src.add_argument("--outputs", type=Path, metavar="FILE",
                     help="what `pulumi stack output --json --show-secrets` printed")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("submit", parents=[where], help="queue a run of the stack's job")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a `training` setting of the stack file, camelCase (steps=50)")
    s.add_argument("--name", help="the run's RayJob name (default: from its settings)")
    s.add_argument("--dry-run", action="store_true",
                   help="print the RayJob and its queue objects; create nothing")
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


def dry_run(args: argparse.Namespace) -> None:
    """The run's RayJob, then the queue objects it waits in. With --stack and no --outputs, from
    the stack file alone: no Pulumi CLI, no outputs, no cluster."""
    if args.outputs is None and not args.stack:
        raise RunsError("submit --dry-run: name the stack file (--stack dev) or --outputs FILE")
    out = _outputs(args) if args.outputs is not None else render.offline(args.stack)
    run = render.render(out, args.set, args.name)
    if args.outputs is None:
        print(f"# from Pulumi.{args.stack}.yaml alone: the image without the stack's pull-through"
              f" cache, the bucket named after deployment ({out.checkpoint_storage})")
    code = run.code.volume(run.job["metadata"]["name"])["configMap"]["name"]
    print(f"# its code: ConfigMap {code}, {run.code.size:,} bytes, created with the run")
    print(yaml.safe_dump_all([run.job, *run.queue], sort_keys=False), end="")


def submit(args: argparse.Namespace, out: outputs.StackOutputs) -> None:
    """The RayJob first, then what it owns (its code ConfigMap, its head's Role): an owner
    reference needs the uid the API server gives the RayJob. If any of them fails the RayJob
    is deleted again, so no run waits for code that never comes."""
    run = render.render(out, args.set, args.name)
    job = run.job
    kube = Kube(out.kubeconfig, out.namespace)
    created = kube.create(job)
    try:
        kube.create_configmap(configmap(run.code, created))
        kube.grant(run_rbac(created))  # its head reads its own RayJob (cold start, watch)
    except RunsError:
        kube.delete(job["metadata"]["name"])
        raise
    print(f"submitted {job['metadata']['name']} (code {run.code.digest[:12]}): "
          "`python -m runs list` shows it queued until the cluster has room")


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
    """The job's JSON summary with the digest of its code: the summary's own (the job records
    what its RayJob gave it; a finished run's summary, printed again, the code that trained it),
    else, for a job from before summaries held it, its RayJob's annotation
    (workloads/code_bundle.py)."""
    job = kube.rayjob(name)
    digest = (job["metadata"].get("annotations") or {}).get(CODE_DIGEST_ANNOTATION, "unknown")
    found = status.summary(_log(kube, name)[1])
    if found is None:
        raise RunsError(f"run {name}: no summary yet ({status.state(job)}; code {digest})")
    print(json.dumps({**found, "code_digest": found.get("code_digest") or digest}, indent=2))


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
        if args.command == "submit" and args.dry_run:
            dry_run(args)
            return 0
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
