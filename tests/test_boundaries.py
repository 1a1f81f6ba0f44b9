"""Import boundaries, for every module of every package (walked, not listed by hand):
- the Pulumi program (`program`, `stack`, `infra`, `workloads`) never loads torch or ray;
- `infra` and `workloads` never import each other: they share the `stack` contract;
- `training` never imports `infra`, `workloads`, the Pulumi-facing part of `stack`, or `bench`,
  and never loads Pulumi; its config module imports only the standard library."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.conftest import REPO

PACKAGES = ("stack", "infra", "workloads", "training", "bench")
PULUMI_FACING = {"stack.pulumi_config"}


def modules(package: str) -> list[str]:
    return sorted(".".join(p.relative_to(REPO).with_suffix("").parts)
                  for p in (REPO / package).rglob("*.py")
                  if "__pycache__" not in p.parts and p.name != "__main__.py")


def imported(module: str) -> set[str]:
    """Every module `module` names in an import statement, at any depth of its code."""
    tree = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def top(name: str) -> str:
    return name.split(".")[0]


def test_every_package_is_walked():
    for package in PACKAGES:
        assert modules(package), package
    assert "training.config" in modules("training") and "stack.config" in modules("stack")


@pytest.mark.parametrize("a, b", [("infra", "workloads"), ("workloads", "infra")])
def test_infra_and_workloads_do_not_import_each_other(a, b):
    offenders = {m: sorted(n for n in imported(m) if top(n) == b) for m in modules(a)}
    assert not {m: v for m, v in offenders.items() if v}


def test_training_imports_no_deployment_code_and_no_benchmark():
    forbidden = {"infra", "workloads", "bench", "pulumi", "pulumi_aws", "pulumi_eks",
                 "pulumi_kubernetes"}
    for m in modules("training"):
        bad = sorted(n for n in imported(m) if top(n) in forbidden or n in PULUMI_FACING
                     or any(n.startswith(p + ".") for p in PULUMI_FACING))
        assert not bad, (m, bad)


def test_job_config_module_imports_only_the_standard_library():
    names = {top(n) for n in imported("training.config")}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names


def loaded_after_import(mods: list[str]) -> set[str]:
    code = (f"import sys\nfor m in {mods!r}: __import__(m)\n"
            "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    return set(out.stdout.split())


def test_pulumi_program_loads_neither_torch_nor_ray():
    loaded = loaded_after_import(["program", *modules("stack"), *modules("infra"),
                                  *modules("workloads")])
    assert "pulumi" in loaded and not loaded & {"torch", "ray", "transformers"}


def test_training_never_loads_pulumi():
    loaded = loaded_after_import(modules("training"))
    assert "torch" in loaded and not any(m.startswith("pulumi") for m in loaded)
