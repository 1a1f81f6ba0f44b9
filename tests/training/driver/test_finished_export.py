"""`--export` on a finished run exports its last checkpoint without a step; its results stay."""

from __future__ import annotations

import json

import pytest

from training.driver import cli
from training.pod_contract import CODE_DIGEST_ENV

pytestmark = pytest.mark.usefixtures("ray_session")
DIGEST = "0f" * 32  # a sha256 hex digest, as workloads/code_bundle.py makes


def test_export_of_a_finished_run_trains_nothing_and_keeps_its_summary(tmp_path, capsys,
                                                                         monkeypatch):
    flags = ["--local", "--storage-path", str(tmp_path / "runs"), "--data", "repeat",
             "--steps", "4", "--seq-len", "32", "--checkpoint-every", "2", "--log-every", "2"]
    trained = cli.run(cli.parse(flags))
    assert trained.export_path is None
    assert trained.code_digest is None  # a local run: no RayJob, no code bundle
    run_dir = tmp_path / "runs" / cli.parse(flags).name
    metrics = (run_dir / "metrics.csv").read_text()
    capsys.readouterr()
    # The next job, as a RayJob's runtime_env starts it (workloads/rayjob.py): its summary names
    # the code it ran.
    monkeypatch.setenv(CODE_DIGEST_ENV, DIGEST)
    exported = cli.run(cli.parse([*flags, "--export"]))
    assert exported.code_digest == DIGEST
    said = capsys.readouterr().out
    assert "finished at step 4 already" in said and "exporting its last checkpoint" in said
    assert "step 1/" not in said  # no step ran
    assert exported.export_path == str(run_dir / "hf_model")
    assert (run_dir / "hf_model/COMPLETE").exists()
    assert (exported.steps, exported.first_loss, exported.last_loss) == \
        (trained.steps, trained.first_loss, trained.last_loss)
    assert (run_dir / "metrics.csv").read_text() == metrics
    # One summary: the file holds what the job prints.
    assert json.loads((run_dir / "summary.json").read_text()) == exported.to_dict()
