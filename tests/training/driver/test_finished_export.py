"""`--export` on a finished run exports its last checkpoint without a step; its results stay."""

from __future__ import annotations

import json

import pytest

from training.driver import cli

pytestmark = pytest.mark.usefixtures("ray_session")


def test_export_of_a_finished_run_trains_nothing_and_keeps_its_summary(tmp_path, capsys):
    flags = ["--local", "--storage-path", str(tmp_path / "runs"), "--data", "repeat",
             "--steps", "4", "--seq-len", "32", "--checkpoint-every", "2", "--log-every", "2"]
    trained = cli.run(cli.parse(flags))
    assert trained.export_path is None
    run_dir = tmp_path / "runs" / cli.parse(flags).name
    metrics = (run_dir / "metrics.csv").read_text()
    capsys.readouterr()
    exported = cli.run(cli.parse([*flags, "--export"]))
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
