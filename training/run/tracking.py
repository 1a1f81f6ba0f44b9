"""MLflow tracking of a training run: rank 0 logs, on a thread of its own, and never fails the run.

One MLflow run per training run: its id is kept in the run directory (`mlflow.json`), so a
resumed or rerun training run continues the same MLflow run. Logged: the resolved settings as
params (a rerun that changes one, say `steps`, records the new value as a `resumed.<key>` tag:
MLflow params cannot change), every numeric field of each metrics row with its step (loss, lr,
grad norm, tokens/s, MFU, and whatever a row adds, such as an eval loss), the summary JSON and
metrics.png as artifacts, and the export's path as the tag `export_path`.

Without a tracking URI nothing here imports mlflow. With one, every call from the training loop
only queues work for the thread; a server that is down, refuses or hangs costs the loop nothing:
the first failure prints one warning, drops the rest, and the summary says why
(`mlflow_error`). HTTP retries and timeouts are bounded (MLFLOW_HTTP_REQUEST_* below, unless the
environment sets them), and `finish` waits at most FINISH_TIMEOUT_S for the thread.
"""

from __future__ import annotations

import json
import math
import os
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from training.run.run_files import RunFiles

RUN_FILE = "mlflow.json"
EXPERIMENT_ENV, DEFAULT_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME", "eks-ray-train"
# mlflow/environment_variables.py defaults: 7 retries with backoff factor 2 and a 120 s timeout,
# minutes per request against a dead server; these keep a failure to seconds.
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
FINISH_TIMEOUT_S = 60.0
_BATCH = 100  # MLflow's log_batch limit for params and tags per request


class Tracker:
    """Tracking off: every call does nothing."""

    def log(self, row: dict, step: int) -> None:
        pass

    def finish(self, artifacts: dict[str, bytes], tags: dict[str, str], failed: bool) -> None:
        pass

    def summary(self) -> dict:
        return {}


def start(uri: str | None, files: RunFiles | None, run_name: str, params: dict) -> Tracker:
    """The tracker of rank 0 (`files` given) when a tracking URI is set; a no-op otherwise. The
    test hooks are no settings of a run and not among `params` (TrainConfig.to_dict)."""
    if not uri or files is None:
        return Tracker()
    return MlflowTracker(uri, files, run_name, params)


class MlflowTracker(Tracker):
    def __init__(self, uri: str, files: RunFiles, run_name: str, params: dict):
        for key, value in HTTP_LIMITS.items():
            os.environ.setdefault(key, value)  # read by mlflow at each request
        self.uri, self.files = uri, files
        self.run_id: str | None = None
        self.error: str | None = None
        self._client = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="mlflow", daemon=True)
        self._thread.start()
        self._submit(self._start, run_name, params)

    def log(self, row: dict, step: int) -> None:
        metrics = {k: float(v) for k, v in row.items() if _is_number(v)}
        self._submit(self._log_metrics, metrics, step, int(time.time() * 1000))

    def finish(self, artifacts: dict[str, bytes], tags: dict[str, str], failed: bool) -> None:
        """Upload the artifacts, set the tags and end the MLflow run; waits a bounded time."""
        self._submit(self._finish, artifacts, tags, "FAILED" if failed else "FINISHED")
        self._queue.put(None)
        self._thread.join(FINISH_TIMEOUT_S)
        if self._thread.is_alive() and self.error is None:
            self._fail(TimeoutError(f"no answer within {FINISH_TIMEOUT_S:.0f} s"))

    def summary(self) -> dict:
        return {"mlflow_run_id": self.run_id, "mlflow_error": self.error}

    def _submit(self, fn: Callable, *args: Any) -> None:
        if self.error is None:
            self._queue.put((fn, args))

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, args = item
            if self.error is not None:
                continue
            try:
                fn(*args)
            except Exception as e:  # any failure of the server or client: tracking stops here
                self._fail(e)

    def _fail(self, e: Exception) -> None:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        self.error = f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]
        print(f"WARNING: MLflow tracking at {self.uri} stopped ({self.error}); training goes on "
              "without it", flush=True)

    def _start(self, run_name: str, params: dict) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag
        from mlflow.exceptions import MlflowException

        client = self._client = MlflowClient(self.uri)
        saved = self.files.read_json(RUN_FILE) or {}
        run = None
        if saved.get("tracking_uri") == self.uri:
            try:
                run = client.get_run(saved["run_id"])
            except MlflowException:  # deleted on the server, or another server's id
                run = None
        if run is None:
            name = os.environ.get(EXPERIMENT_ENV, DEFAULT_EXPERIMENT)
            exp = client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp else client.create_experiment(name)
            run = client.create_run(exp_id, run_name=run_name)
            self.files.write_json(RUN_FILE, {"run_id": run.info.run_id, "tracking_uri": self.uri,
                                             "experiment_id": exp_id})
        else:
            client.update_run(run.info.run_id, status="RUNNING")
        self.run_id = run.info.run_id
        logged = run.data.params
        values = {k: json.dumps(v) if isinstance(v, (dict, list)) else str(v)
                  for k, v in params.items()}
        new = [Param(k, v) for k, v in values.items() if k not in logged]
        changed = [RunTag(f"resumed.{k}", v) for k, v in values.items()
                   if k in logged and logged[k] != v]
        for i in range(0, max(len(new), len(changed)), _BATCH):
            client.log_batch(self.run_id, params=new[i:i + _BATCH], tags=changed[i:i + _BATCH])

    def _log_metrics(self, metrics: dict[str, float], step: int, timestamp_ms: int) -> None:
        from mlflow.entities import Metric

        self._client.log_batch(self.run_id, metrics=[Metric(k, v, timestamp_ms, step)
                                                     for k, v in metrics.items()])

    def _finish(self, artifacts: dict[str, bytes], tags: dict[str, str], status: str) -> None:
        with tempfile.TemporaryDirectory(prefix="mlflow-") as d:
            for name, payload in artifacts.items():
                if payload:
                    Path(d, name).write_bytes(payload)
                    self._client.log_artifact(self.run_id, str(Path(d, name)))
        for key, value in tags.items():
            self._client.set_tag(self.run_id, key, value)
        self._client.set_terminated(self.run_id, status=status)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
