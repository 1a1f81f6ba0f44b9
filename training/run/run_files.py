"""Files rank 0 writes into the run directory (local or S3): metrics.csv, the plot, the export,
the summary."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow.fs as pafs
import ray.train

from training.run.facts import MetricsRow
from training.step.metrics import merge_csv, plot_csv
from training.storage import display_path


class RunFiles:
    def __init__(self, fs: pafs.FileSystem, run_dir: str):
        self.fs, self.run_dir = fs, run_dir

    @classmethod
    def from_context(cls) -> "RunFiles":
        storage = ray.train.get_context().get_storage()
        return cls(storage.storage_filesystem, storage.experiment_fs_path)

    def uri(self, name: str) -> str:
        """`run_dir/name` as a user writes it (s3://... on S3)."""
        return display_path(self.fs, f"{self.run_dir}/{name}")

    def read_bytes(self, name: str) -> bytes:
        """The file's contents; empty when it does not exist."""
        path = f"{self.run_dir}/{name}"
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return b""
        with self.fs.open_input_stream(path) as f:
            return f.read()

    def _read(self, name: str) -> str:
        return self.read_bytes(name).decode()

    def _write(self, name: str, payload: bytes) -> None:
        self.fs.create_dir(self.run_dir, recursive=True)
        with self.fs.open_output_stream(f"{self.run_dir}/{name}") as f:
            f.write(payload)

    def write_json(self, name: str, payload: dict) -> None:
        self._write(name, json.dumps(payload).encode())

    def read_json(self, name: str) -> dict | None:
        text = self._read(name)
        return json.loads(text) if text else None

    def append_metrics(self, rows: list[MetricsRow]) -> None:
        if rows:
            self._write("metrics.csv", merge_csv(self._read("metrics.csv"),
                                                 [r.to_dict() for r in rows]).encode())

    def plot(self) -> None:
        text = self._read("metrics.csv")
        if not text:
            return
        with tempfile.TemporaryDirectory() as d:
            png = Path(d, "metrics.png")
            plot_csv(text, png)
            self._write("metrics.png", png.read_bytes())

    def publish(self, local: str, name: str, marker: str) -> None:
        """Replace `run_dir/name` with the local directory's files, then write `marker` into it:
        a directory with the marker holds every file (no marker: torn, or being replaced)."""
        target = f"{self.run_dir}/{name}"
        self.fs.create_dir(target, recursive=True)
        self.fs.delete_dir_contents(target)  # the marker first: never a mix of two versions
        pafs.copy_files(local, target, destination_filesystem=self.fs)
        self._write(f"{name}/{marker}", b"all files written\n")

    def has(self, name: str) -> bool:
        return self.fs.get_file_info(f"{self.run_dir}/{name}").type == pafs.FileType.File
