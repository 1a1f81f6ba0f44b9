"""Files rank 0 writes into the run directory (local or S3): metrics.csv, the plot, the export."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Iterator

import pyarrow.fs as pafs
import ray.train

from training.metrics import merge_csv, plot_csv


class RunFiles:
    def __init__(self, fs: pafs.FileSystem, run_dir: str):
        self.fs, self.run_dir = fs, run_dir

    @classmethod
    def from_context(cls) -> "RunFiles":
        storage = ray.train.get_context().get_storage()
        return cls(storage.storage_filesystem, storage.experiment_fs_path)

    def _read(self, name: str) -> str:
        path = f"{self.run_dir}/{name}"
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return ""
        with self.fs.open_input_stream(path) as f:
            return f.read().decode()

    def _write(self, name: str, payload: bytes) -> None:
        self.fs.create_dir(self.run_dir, recursive=True)
        with self.fs.open_output_stream(f"{self.run_dir}/{name}") as f:
            f.write(payload)

    def write_json(self, name: str, payload: dict) -> None:
        self._write(name, json.dumps(payload).encode())

    def read_json(self, name: str) -> dict | None:
        text = self._read(name)
        return json.loads(text) if text else None

    def append_metrics(self, rows: list[dict]) -> None:
        if rows:
            self._write("metrics.csv", merge_csv(self._read("metrics.csv"), rows).encode())

    def plot(self) -> None:
        text = self._read("metrics.csv")
        if not text:
            return
        with tempfile.TemporaryDirectory() as d:
            png = Path(d, "metrics.png")
            plot_csv(text, png)
            self._write("metrics.png", png.read_bytes())

    @contextlib.contextmanager
    def local_dir(self, name: str) -> Iterator[str]:
        """A local directory whose contents are copied to `run_dir/name` on success."""
        with tempfile.TemporaryDirectory() as d:
            yield d
            self.fs.create_dir(f"{self.run_dir}/{name}", recursive=True)
            pafs.copy_files(d, f"{self.run_dir}/{name}", destination_filesystem=self.fs)
