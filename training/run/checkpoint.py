"""Sharded checkpoints with torch.distributed.checkpoint (DCP), and which one a run resumes from.

Every rank writes its shard into a local directory and reports it; in Ray Train's default SYNC
mode `ray.train.report` returns only after this rank's files are in storage
(ray/train/v2/_internal/execution/context.py, `report` -> `_upload_checkpoint`). After a barrier,
rank 0 writes the `COMPLETE` marker, so a marked directory holds every rank's files.

Ray Train itself registers a reported checkpoint only on its controller's next poll (about every
2 s); a worker dying in that window loses the registration, not the files. A run therefore
resumes from the newest checkpoint that is marked complete or registered, whichever is newer.
Torn directories (no marker, never registered) are never loaded.

What is saved is the trainable state: a LoRA run's checkpoint holds its adapters, their Adam
state and the run state, not the frozen base, which the resumed run reads from --model again
(`get_state_dict(..., ignore_frozen_params=True)`); the adapters' identity (base, rank, alpha,
targets) is saved with them and a resume with other settings is refused before loading.

Asynchronous saves (`--async-checkpoint`, `Saver`): `dcp.async_save` copies this rank's shards to
host memory and returns; a thread writes them and uploads the files to storage while training
goes on. Each rank's upload thread then joins the others' on a gloo group of their own, and
rank 0's writes `COMPLETE` as soon as every rank's upload is done, so no step waits for it and a
kill loses at most the steps since that save. The next save (at most one in flight), the end of
the run or a fault hook waits for the thread and registers the already-uploaded directory with
Ray Train (`CheckpointUploadMode.NO_UPLOAD`). A worker dying during an upload leaves a directory
without the marker, never loaded.

`Saver.save_now`, a preemption's checkpoint: the save in flight finished, then a synchronous one.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow.fs as pafs
import ray.train
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     set_state_dict)

from training.config import TrainConfig
from training.step.engine import Engine
from training.step.schedule import Schedule, resume_schedule
from training.model.model import tied_aliases
from training.run.run_files import RunFiles

STATE_FILE = "train_state.json"
MARKER = "COMPLETE"
_DIR = re.compile(r"^checkpoint-step(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or resumed from."""


@dataclass(frozen=True)
class RunState:
    """What a checkpoint records besides the weights and optimizer state."""
    step: int
    samples_seen: int = 0  # sequences consumed across all ranks (text data)
    first_loss: float | None = None  # the run's, not the attempt's
    first_eval_loss: float | None = None  # before the run's first step
    schedule: dict = field(default_factory=dict)  # training.step.schedule.Schedule.to_dict()
    data: str | None = None  # fingerprint of the tokenized text (training.data.cache.TokenCache)

    @classmethod
    def from_json(cls, text: str, where: str) -> "RunState":
        """The state a checkpoint recorded; one written by an older version of the job (no
        sample position or schedule) is refused with what to do, not a TypeError per worker."""
        try:
            saved = json.loads(text)
            if not isinstance(saved, dict) or "schedule" not in saved:
                raise ValueError("no schedule")
            return cls(**saved)
        except (TypeError, ValueError):
            raise CheckpointError(
                f"checkpoint {where} was written by an older version of the job (no sample "
                "position or learning-rate schedule): start a new run (another --name, or "
                "another model/data on a stack) or delete that checkpoint") from None


def start_state(cfg: TrainConfig, saved: RunState | None,
                data_id: str) -> tuple[RunState, Schedule, list[str]]:
    """Where an attempt starts, its schedule (the saved one, extended to --steps), and the
    warnings for settings the saved run overrides. Refuses a checkpoint trained on other data:
    its sample position would mean nothing here. Pure: the driver's resume check before Ray
    and every worker's start read the same answer."""
    if saved is None:
        fresh = Schedule.from_config(cfg)
        return RunState(step=0, schedule=fresh.to_dict(), data=data_id), fresh, []
    if saved.data != data_id:
        raise CheckpointError(  # the settings themselves are compared first (run_record.py)
            f"run {cfg.name!r} was trained on other data: the contents of --data {cfg.data} "
            "changed since its checkpoint (or, for a run from before run.json, its --tokenizer, "
            "--seq-len, --loss-tokens, --eval-fraction or --seed), so its data position does not "
            "apply; train on the data it saw, or start a new run with another --name")
    schedule, notes = resume_schedule(saved.schedule, peak=cfg.lr, warmup=cfg.warmup_steps,
                                      total=cfg.steps, at_step=saved.step)
    return dataclasses.replace(saved, schedule=schedule.to_dict()), schedule, notes


def dir_name(step: int) -> str:
    return f"checkpoint-step{step:07d}"


# Frozen parameters (a LoRA run's base) are not saved: they come from --model again on resume.
_TRAINABLE = StateDictOptions(ignore_frozen_params=True)
ADAPTER_KEY = "adapter"  # LoRA: the adapters' identity (LoraSpec JSON), checked before loading


def _state_dict(engine: Engine) -> dict:
    """Shards of the trainable parameters and their optimizer state; tied parameters once
    (get_state_dict lists the tied LM head under both names); a LoRA run's adapter identity."""
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer, options=_TRAINABLE)
    for alias in tied_aliases(engine.model):
        model_sd.pop(alias, None)
    out = {"model": model_sd, "optim": optim_sd}
    if engine.lora is not None:
        out[ADAPTER_KEY] = engine.lora.to_json()
    return out


def _tuned(spec: dict | None) -> str:
    return f"LoRA adapters {spec}" if spec else "every weight (--lora-rank 0)"


def _check_matches(wanted: dict, directory: str) -> None:
    """Refuse a checkpoint of other adapters (or none) or of another model's weights, naming
    what differs, before DCP fails on a missing key."""
    saved = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
    found = {ADAPTER_KEY: ""}
    if ADAPTER_KEY in saved:
        dcp.load(found, checkpoint_id=directory)
    theirs, ours = (json.loads(x) if x else None for x in (found[ADAPTER_KEY],
                                                            wanted.get(ADAPTER_KEY)))
    if theirs != ours:
        raise CheckpointError(
            f"checkpoint {directory} fine-tunes {_tuned(theirs)}, this run {_tuned(ours)}: "
            "resume with the --model and --lora-* flags it was saved with, or use a new --name")
    missing = {f"model.{k}" for k in wanted["model"]} - set(saved)
    if missing:
        raise CheckpointError(
            f"checkpoint {directory} holds other weights than this run's model ({len(missing)} "
            f"missing, e.g. {sorted(missing)[0]}): resume with the --model it was saved with, "
            "or use a new --name")


def save_local(engine: Engine, state: RunState, directory: str) -> None:
    """Collective: every rank writes its shards of model and optimizer into `directory`."""
    dcp.save(_state_dict(engine), checkpoint_id=directory)
    _write_state(state, directory)


def _write_state(state: RunState, directory: str) -> None:
    if dist.get_rank() == 0:
        Path(directory, STATE_FILE).write_text(json.dumps(asdict(state)))


def load_local(engine: Engine, directory: str) -> RunState:
    """Restore model and optimizer shards in place from `directory`; returns the run state."""
    if not Path(directory, ".metadata").exists() or not Path(directory, STATE_FILE).exists():
        raise CheckpointError(f"checkpoint {directory} is incomplete (no DCP metadata or train "
                              "state); delete it to resume from the one before")
    state = RunState.from_json(Path(directory, STATE_FILE).read_text(), directory)
    loaded = _state_dict(engine)
    _check_matches(loaded, directory)
    dcp.load(loaded, checkpoint_id=directory)
    for alias, canonical in tied_aliases(engine.model).items():
        if canonical in loaded["model"]:  # not when frozen (LoRA): neither name was saved
            loaded["model"][alias] = loaded["model"][canonical]
    # A LoRA run loads its adapters only: its frozen base is already in place.
    set_state_dict(engine.model, engine.optimizer, model_state_dict=loaded["model"],
                   optim_state_dict=loaded["optim"],
                   options=StateDictOptions(strict=engine.lora is None))
    return state


def _unmark(fs: pafs.FileSystem, marker: str) -> None:
    """Collective: no COMPLETE marker before this step's files are all new (re-saving a step
    after resuming from an older checkpoint)."""
    if dist.get_rank() == 0 and fs.get_file_info(marker).type != pafs.FileType.NotFound:
        fs.delete_file(marker)
    dist.barrier()


def _mark(fs: pafs.FileSystem, marker: str) -> None:
    """Collective: after every rank's upload has returned, rank 0 marks the directory."""
    dist.barrier()
    if dist.get_rank() == 0:
        _write_marker(fs, marker)


def _write_marker(fs: pafs.FileSystem, marker: str) -> None:
    with fs.open_output_stream(marker) as f:
        f.write(b"all ranks uploaded\n")


def save_and_report(engine: Engine, state: RunState, metrics: dict) -> None:
    """Collective: save, let Ray Train upload and register it, then mark it complete."""
    fs, run_dir = _storage()
    marker = f"{run_dir}/{dir_name(state.step)}/{MARKER}"
    _unmark(fs, marker)
    with tempfile.TemporaryDirectory(prefix="ckpt-") as local:
        save_local(engine, state, local)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(local),
                         checkpoint_dir_name=dir_name(state.step))
    _mark(fs, marker)


class _Upload(threading.Thread):
    """Waits for this rank's DCP write to finish, copies its files to storage, then, with every
    rank's upload thread (`group`), has rank 0 mark the directory once all of them succeeded."""

    def __init__(self, written, local: str, fs: pafs.FileSystem, target: str,
                 group: dist.ProcessGroup, stall: bool = False):
        super().__init__(daemon=True, name="checkpoint-upload")
        self.written, self.local, self.fs, self.target = written, local, fs, target
        self.group, self.stall = group, stall
        self.error: BaseException | None = None
        self.complete = False  # every rank uploaded and the marker is written

    def run(self) -> None:
        try:
            self.written.result()
            if self.stall:  # test hook (--stall-upload-at-step): an upload that never ends
                threading.Event().wait()
            self.fs.create_dir(self.target, recursive=True)
            pafs.copy_files(self.local, self.target, source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=self.fs)
        except BaseException as e:  # re-raised on the training thread by Saver.wait
            self.error = e
        finally:
            shutil.rmtree(self.local, ignore_errors=True)
        try:
            uploaded = torch.tensor([self.error is None], dtype=torch.int32)
            dist.all_reduce(uploaded, op=dist.ReduceOp.MIN, group=self.group)
            if uploaded.item() and dist.get_rank() == 0:
                _write_marker(self.fs, f"{self.target}/{MARKER}")
            self.complete = bool(uploaded.item())
        except BaseException as e:
            self.error = self.error or e


class Saver:
    """Checkpoints of one run: synchronous (`save_and_report`) or asynchronous, at most one in
    flight."""

    def __init__(self, asynchronous: bool):
        self.asynchronous = asynchronous
        self._pending: tuple[_Upload, str, dict] | None = None
        self._stall_next = False
        # async_save plans and finishes the save with collectives from its own thread, on host
        # tensors: a group of its own, so they never interleave with training's collectives on
        # the default group, and gloo, since it refuses a group without a CPU backend
        # (torch/distributed/checkpoint/state_dict_saver.py, async_save). The upload threads
        # agree on the marker on another one.
        self._group = dist.new_group(backend="gloo") if asynchronous else None
        self._marker_group = dist.new_group(backend="gloo") if asynchronous else None

    def save(self, engine: Engine, state: RunState, metrics: dict) -> None:
        """Collective. Synchronous: returns once the checkpoint is complete. Asynchronous:
        returns once this step's shards are in host memory (after finishing the previous one)."""
        if not self.asynchronous:
            save_and_report(engine, state, metrics)
            return
        self.wait()
        fs, run_dir = _storage()
        target = f"{run_dir}/{dir_name(state.step)}"
        _unmark(fs, f"{target}/{MARKER}")
        local = tempfile.mkdtemp(prefix="ckpt-")
        written = dcp.async_save(_state_dict(engine), checkpoint_id=local,
                                 process_group=self._group)
        _write_state(state, local)
        upload = _Upload(written, local, fs, target, self._marker_group, self._stall_next)
        self._stall_next = False
        upload.start()
        self._pending = (upload, target, metrics)

    def save_now(self, engine: Engine, state: RunState, metrics: dict) -> None:
        """Collective: a complete checkpoint of this step before returning (a preemption's),
        after the save in flight, in either mode. A save in flight that failed (every rank
        agrees: `_Upload` reduces the outcome) is reported and passed over, not raised: this
        step's checkpoint supersedes it, and raising would turn the preemption into a failure
        charged to --max-failures, where the run could resume."""
        try:
            self.wait()
        except CheckpointError as e:
            if dist.get_rank() == 0:
                print(f"WARNING: {e}; saving this step's checkpoint instead", flush=True)
        save_and_report(engine, state, metrics)

    def stall_next_upload(self) -> None:
        """Test hook (--stall-upload-at-step): this rank's next asynchronous upload never ends."""
        self._stall_next = True

    def wait(self) -> None:
        """Collective: finish the save in flight, if any (its marker is written when every
        rank's upload is done), and register it with Ray Train."""
        if self._pending is None:
            return
        upload, target, metrics = self._pending
        self._pending = None
        upload.join()
        if not upload.complete:
            why = upload.error or "another rank's upload failed"
            raise CheckpointError(f"saving {target} failed: {why}") from upload.error
        fs, _ = _storage()
        from ray.train import CheckpointUploadMode

        ray.train.report(metrics, checkpoint=ray.train.Checkpoint(target, filesystem=fs),
                         checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def latest(fs: pafs.FileSystem, run_dir: str,
           registered: ray.train.Checkpoint | None) -> ray.train.Checkpoint | None:
    """The newest checkpoint that is marked complete or registered by Ray Train."""
    best_step, best = -1, registered
    if registered is not None and (m := _DIR.match(Path(registered.path).name)):
        best_step = int(m.group(1))
    listing = fs.get_file_info(pafs.FileSelector(run_dir, allow_not_found=True))
    for info in listing:
        m = _DIR.match(info.base_name)
        if m and info.type == pafs.FileType.Directory and int(m.group(1)) > best_step and \
                fs.get_file_info(f"{info.path}/{MARKER}").type == pafs.FileType.File:
            best_step, best = int(m.group(1)), ray.train.Checkpoint(info.path, filesystem=fs)
    return best


def resume(engine: Engine) -> RunState | None:
    """Load the run's newest complete checkpoint, if any."""
    fs, run_dir = _storage()
    ckpt = latest(fs, run_dir, ray.train.get_checkpoint())
    if ckpt is None:
        return None
    with ckpt.as_directory() as d:
        return load_local(engine, d)


def _storage() -> tuple[pafs.FileSystem, str]:
    files = RunFiles.from_context()
    return files.fs, files.run_dir
