"""Ctrl-C on a running job (`python -m training` in a terminal, its own local Ray): one line
saying what was saved and how to go on, exit status 130 (128 + SIGINT, as a shell reports it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import REPO
from training.driver import cli


def test_ctrl_c_says_what_was_saved_and_exits_130(tmp_path):
    runs = tmp_path / "runs"
    flags = ["--local", "--data", "repeat", "--steps", "100000", "--seq-len", "32",
             "--checkpoint-every", "3", "--no-async-checkpoint", "--storage-path", str(runs)]
    name = cli.parse(flags).name
    job = subprocess.Popen(
        [sys.executable, "-m", "training", *flags],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)  # its own process group: Ctrl-C reaches the job and its workers
    saved = runs / name / "checkpoint-step0000003/COMPLETE"
    try:
        deadline = time.monotonic() + 600
        while not saved.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert saved.exists(), job.communicate(timeout=60)[1][-2000:]
        os.killpg(job.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        out, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == cli.EXIT_INTERRUPTED, err[-2000:]
    said = [line for line in err.splitlines() if line.startswith("interrupted:")]
    assert len(said) == 1, err[-2000:]
    assert f"run {name!r} is saved at step " in said[0]
    assert "rerun the same command to resume from there" in said[0]
    assert not out.strip().startswith("{")  # no summary line: the run did not end
