"""Import boundaries: the Pulumi program never loads torch or ray; training never loads Pulumi."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PROGRAM_MODULES = ["program", "infra.config", "infra.cluster", "infra.network", "infra.storage",
                   "infra.cost", "infra.existing", "workloads.addons", "workloads.ray",
                   "workloads.raycluster", "workloads.rayjob", "workloads.code_bundle"]
TRAINING_MODULES = ["training.cli", "training.loop", "training.bench", "training.nccl",
                    "training.transport", "training.checkpoint"]


def loaded_after_import(modules: list[str]) -> set[str]:
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    return set(out.stdout.split())


def test_pulumi_program_imports_neither_torch_nor_ray():
    loaded = loaded_after_import(PROGRAM_MODULES)
    assert "pulumi" in loaded and not loaded & {"torch", "ray", "transformers"}


def test_training_never_imports_pulumi():
    loaded = loaded_after_import(TRAINING_MODULES)
    assert "torch" in loaded and not any(m.startswith("pulumi") for m in loaded)
