"""The deploy install: `pulumi up` creates the program's virtualenv from requirements.txt, the one
file the Python language host's pip toolchain installs (pulumi/pulumi sdk/python/toolchain/pip.go;
its runtime options name only the virtualenv, toolchain and typechecker). So requirements.txt is
the program's set (the Pulumi SDKs and PyYAML), the program must import with nothing beyond it and
its dependencies, and the training and test packages (GBs of torch and Ray) live in
requirements-dev.txt."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO
from tests.test_boundaries import imported

PROJECT = {"program", "stack", "infra", "workloads", "training"}


def requirements(path) -> list[Requirement]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def closure(reqs: list[Requirement]) -> set[str]:
    """Every distribution pip installs for `reqs`: them and their dependencies, markers (and
    extras) evaluated as pip does, read from the installed metadata."""
    seen: set[str] = set()
    todo = [(r, r.extras) for r in reqs]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.distribution(name).requires or []:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e})
                                         for e in (*extras, "")):
                todo.append((dep, dep.extras))
    return seen


def deploy_imports() -> set[str]:
    """Top-level module names the deploy set provides."""
    dists = closure(requirements(REPO / "requirements.txt"))
    return {top for top, owners in metadata.packages_distributions().items()
            if any(canonicalize_name(o) in dists for o in owners)}


def reachable(module: str) -> set[str]:
    """The project's modules `module` imports, at any depth of their code, transitively."""
    seen, todo = set(), [module]
    while todo:
        current = todo.pop()
        if current in seen or not (REPO / (current.replace(".", "/") + ".py")).exists():
            continue
        seen.add(current)
        todo.extend(n for n in imported(current) if n.split(".")[0] in PROJECT)
    return seen


def test_the_program_imports_only_the_deploy_set_even_inside_functions():
    allowed = deploy_imports() | set(sys.stdlib_module_names) | PROJECT | {"__future__"}
    outside = {m: sorted(n for n in imported(m) if n.split(".")[0] not in allowed)
               for m in reachable("__main__")}
    assert not {m: v for m, v in outside.items() if v}, outside
    assert {"program", "stack.config", "training.config"} <= reachable("__main__")


# Refuses every import the deploy set cannot serve, then imports what __main__ imports. The
# standard library's build-time variables (`_sysconfigdata_<abi>_<platform>`, which sysconfig
# imports: the kubernetes client's watch module loads pydoc, which asks sysconfig for a path)
# are a module sys.stdlib_module_names does not list.
_BLOCKED_IMPORT = """
import importlib.abc, json, sys
allowed, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in allowed and not name.startswith("_sysconfigdata_"):
            raise ImportError(f"{name} is not in requirements.txt or its dependencies")
sys.meta_path.insert(0, Refuse())
for m in modules:
    __import__(m)
print(json.dumps(sorted({n.partition(".")[0] for n in sys.modules})))
"""


def test_the_program_starts_with_only_the_deploy_requirements_and_needs_each_of_them():
    allowed = deploy_imports() | set(sys.stdlib_module_names) | PROJECT
    tree = ast.parse((REPO / "__main__.py").read_text())
    entry = sorted({a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
                   | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)})
    out = subprocess.run([sys.executable, "-c", _BLOCKED_IMPORT, json.dumps(sorted(allowed)),
                          json.dumps(entry)], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(json.loads(out.stdout))
    owners = metadata.packages_distributions()
    used = {canonicalize_name(d) for top in loaded for d in owners.get(top, ())}
    named = {canonicalize_name(r.name) for r in requirements(REPO / "requirements.txt")}
    assert named <= used, f"requirements.txt names what the program never loads: {named - used}"
    assert not loaded & {"torch", "ray", "transformers", "matplotlib"}


def test_make_test_installs_the_deploy_set_and_the_rest():
    dev = requirements(REPO / "requirements-dev.txt")
    assert "-r requirements.txt" in (REPO / "requirements-dev.txt").read_text().splitlines()
    assert {canonicalize_name(r.name) for r in dev} >= {"torch", "ray", "pytest"}
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "=="
               for r in dev + requirements(REPO / "requirements.txt"))  # exact pins
    assert "pip install -q -r requirements-dev.txt" in (REPO / "Makefile").read_text()
