"""Import boundaries, for every module of every package (walked, not listed by hand):
- the Pulumi program (`program`, `stack`, `infra`, `workloads`) never loads torch or ray;
- `infra` and `workloads` never import each other: they share the `stack` contract, whose
  Pulumi-free part imports neither of them nor Pulumi;
- `training` never imports `infra`, `workloads`, the Pulumi-facing part of `stack`, or `bench`,
  and never loads Pulumi; the job's settings, command line and error root (`training.config`,
  `training.flags`, `training.errors`) import only the standard library and each other;
- `training`'s subpackages import only downward (`LAYERS`);
- `runs` (`python -m runs`) imports `stack` and `workloads` but never `infra`, `bench` or a
  Pulumi-facing module, and loads neither Pulumi nor torch nor Ray."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.conftest import REPO

PACKAGES = ("stack", "infra", "workloads", "training", "bench", "runs")
PULUMI = {"pulumi", "pulumi_aws", "pulumi_eks", "pulumi_kubernetes"}


def modules(package: str) -> list[str]:
    return sorted(".".join(p.relative_to(REPO).with_suffix("").parts)
                  for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts)


def importable(package: str) -> list[str]:
    """Modules that can be imported without running something (`__main__` runs the CLI)."""
    return [m for m in modules(package) if not m.endswith(".__main__")]


def imported(module: str) -> set[str]:
    """Every module `module` names in an import statement, at any depth of its code; relative
    imports resolved against its package."""
    path = REPO / (module.replace(".", "/") + ".py")
    package = module.split(".")[:-1]  # `pkg.__init__` and `pkg.mod` both resolve against `pkg`
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            full = ".".join([*base, *([node.module] if node.module else [])])
            names.add(full)
            names.update(f"{full}.{a.name}" for a in node.names)
    return names


def top(name: str) -> str:
    return name.split(".")[0]


def pulumi_facing(package: str) -> set[str]:
    return {m for m in modules(package) if {top(n) for n in imported(m)} & PULUMI}


def test_every_package_is_walked():
    for package in PACKAGES:
        assert modules(package), package
    assert "training.config" in modules("training") and "training.__main__" in modules("training")
    assert pulumi_facing("stack") == {"stack.pulumi_config"}


@pytest.mark.parametrize("a, b", [("infra", "workloads"), ("workloads", "infra")])
def test_infra_and_workloads_do_not_import_each_other(a, b):
    offenders = {m: sorted(n for n in imported(m) if top(n) == b) for m in modules(a)}
    assert not {m: v for m, v in offenders.items() if v}


def test_the_contract_imports_no_layer_and_no_pulumi_outside_its_pulumi_facing_module():
    for m in set(modules("stack")) - pulumi_facing("stack"):
        bad = sorted(n for n in imported(m) if top(n) in {"infra", "workloads", "bench", *PULUMI})
        assert not bad, (m, bad)


def test_training_imports_no_deployment_code_and_no_benchmark():
    forbidden_modules = pulumi_facing("stack")
    for m in modules("training"):
        bad = sorted(n for n in imported(m) if top(n) in {"infra", "workloads", "bench", *PULUMI}
                     or any(n == f or n.startswith(f + ".") for f in forbidden_modules))
        assert not bad, (m, bad)


STDLIB_MODULES = ("training.config", "training.options", "training.field_types", "training.flags",
                  "training.errors", "training.settings", "training.run_names",
                  "training.pod_contract")


@pytest.mark.parametrize("module", STDLIB_MODULES)
def test_job_settings_and_flags_import_only_the_standard_library(module):
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    bad = {n for n in imported(module) if top(n) not in allowed
           and not any(n == m or n.startswith(m + ".") for m in STDLIB_MODULES)}
    assert not bad, bad


def loaded_after_import(mods: list[str]) -> set[str]:
    code = (f"import sys\nfor m in {mods!r}: __import__(m)\n"
            "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    return set(out.stdout.split())


def test_pulumi_program_loads_neither_torch_nor_ray():
    loaded = loaded_after_import(["program", *importable("stack"), *importable("infra"),
                                  *importable("workloads")])
    assert "pulumi" in loaded and not loaded & {"torch", "ray", "transformers"}


def test_training_never_loads_pulumi():
    loaded = loaded_after_import(importable("training"))
    assert "torch" in loaded and not any(m.startswith("pulumi") for m in loaded)


# training/'s subpackages, lowest first: each imports only from those before it (and the
# standard-library top: config, flags, errors, storage), so a reader finds where a change goes.
LAYERS = ("model", "data", "step", "network", "run", "head", "driver")


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "training" and parts[1] in LAYERS else None


@pytest.mark.parametrize("module", [m for m in importable("training") if _layer(m)])
def test_training_subpackages_import_only_downward(module):
    mine = LAYERS.index(_layer(module))
    upward = sorted(n for n in imported(module) if _layer(n) and LAYERS.index(_layer(n)) > mine)
    assert not upward, f"{module} imports from a layer above it: {upward}"


def test_runs_imports_no_infra_no_benchmark_and_no_pulumi_facing_module():
    facing = pulumi_facing("stack") | pulumi_facing("workloads")
    for m in modules("runs"):
        bad = sorted(n for n in imported(m) if top(n) in {"infra", "bench", *PULUMI}
                     or any(n == f or n.startswith(f + ".") for f in facing))
        assert not bad, (m, bad)


def test_runs_loads_neither_pulumi_nor_torch_nor_ray():
    loaded = loaded_after_import(importable("runs"))
    assert "kubernetes" in loaded and "workloads" in loaded
    assert not loaded & {"torch", "ray", "transformers"} and not any(
        m.startswith("pulumi") for m in loaded)
