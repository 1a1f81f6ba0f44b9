"""MLflow tracking without a Ray run: off means not imported; a hanging server never blocks the
loop. (The job against a real tracking server, and one that is down: tests/training/driver/test_job.py.)"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pyarrow.fs as pafs

from tests.conftest import REPO
from training.run import tracking
from training.config import TrainConfig
from training.run.run_files import RunFiles


def test_without_a_uri_nothing_is_tracked_and_mlflow_is_not_imported(tmp_path):
    code = f"""
import sys, pyarrow.fs as pafs
import training.driver.cli, training.run.loop
from training.run import tracking
from training.run.run_files import RunFiles
t = tracking.start(None, RunFiles(pafs.LocalFileSystem(), {str(tmp_path)!r}), "run", {{"a": 1}})
t.log({{"loss": 1.0}}, 1)
t.finish({{"summary.json": b"{{}}"}}, {{"export_path": "x"}}, failed=False)
print("mlflow" in sys.modules, t.summary())
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "False {}"
    assert list(tmp_path.iterdir()) == []  # no run id file either


def test_a_hanging_server_never_blocks_the_loop_and_is_reported(tmp_path, monkeypatch):
    """The server accepts and never answers: every tracker call returns while the first request
    is still unanswered, and once the connection drops the summary says tracking stopped."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted = threading.Event()
    release = threading.Event()

    def hang():
        conn, _ = server.accept()
        accepted.set()
        release.wait()
        conn.close()  # drop it unanswered

    threading.Thread(target=hang, daemon=True).start()
    files = RunFiles(pafs.LocalFileSystem(), str(tmp_path))
    uri = f"http://127.0.0.1:{server.getsockname()[1]}"
    tracker = tracking.start(uri, files, "run", {"steps": 3})
    assert accepted.wait(120)  # the tracker's thread is waiting for an answer now
    for step in range(1, 101):
        tracker.log({"loss": 1.0 / step, "lr": 1e-3, "note": "text is skipped"}, step)
    assert not release.is_set()  # all logged while the server still had not answered
    release.set()
    tracker.finish({"summary.json": b"{}"}, {}, failed=False)
    summary = tracker.summary()
    assert summary["mlflow_run_id"] is None and summary["mlflow_error"]
    server.close()


def test_a_tracking_uri_that_is_not_a_server_url_is_refused():
    assert any("--mlflow-tracking-uri must be a tracking server's http:// or https:// URL" in p
               for p in TrainConfig(mlflow_tracking_uri="localhost:5000").problems())
    assert not TrainConfig(mlflow_tracking_uri="https://mlflow.example.com/").problems()
